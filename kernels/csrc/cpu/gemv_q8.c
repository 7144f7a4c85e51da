/*
 * GGUF-block (and int8-row) linears for decode-sized batches with int8 activations (--quantization gguf /
 * int8 on a bf16 model), the scheme of llama.cpp's vec_dot_q8_0_q8_0 / vec_dot_q4_1_q8_1, over the
 * weights repacked into tiles:
 *
 *   x [M, K] -> per block of 32 (Q8 activations): dx = max|x| / 127, qx = round(x / dx) in [-127, 127],
 *               sx = sum(x) (float);
 *   Q8_0 block (fp16 dw, 32 int8 qw):            w = dw qw       dot = dw dx sum(qw qx)
 *   Q4_1 block (fp16 dw, fp16 mw, 32 nibbles qw): w = dw qw + mw  dot = dw dx sum(qw qx) + mw sx
 *   Q5_0 block (fp16 dw, 32 fifth bits, 32 nibbles): qw = nibble | bit << 4 in 0 .. 31, w = dw (qw - 16),
 *                                                 dot = dw dx sum(qw qx) - 16 dw sx (Q4_1's with mw = -16 dw)
 *   Q4_K sub-block of 32 (its super-block's fp16 d / dmin, 6-bit sc / m, 32 nibbles): Q4_1's with
 *                                                 dw = d sc, mw = -dmin m (exact in float32)
 *   Q6_K sub-block of 16 (its super-block's fp16 d, int8 sc, 16 quants q - 32 in -32 .. 31): Q8_0's with
 *                                                 a scale d sc per 16 weights
 *   INT8 row (int8 qw, float32 scale s per row):  w = s qw         row = s sum_b dx_b sum(qw qx)
 *   out[m, n] = sum of the row's block dots, float32 sums, stored bf16 or float32.
 *
 * Precision: sum(qw qx) is an exact integer on every path (32 products, |qw| <= 128, |qx| <= 127), so
 * the only error against dequantize-then-matmul is the activations' rounding, |x - dx qx| <= dx / 2:
 * |out - exact| <= sum_b dx_b / 2 * sum_{j in b} |w_j| (tests/test_cpu_linears.py checks that bound and
 * the exact result on the quantized operands). GGUFLinear / Int8Linear use it for bf16 models (activations
 * rounded to 8 significant bits already); float32 models keep gemv.c's float sums on the file's blocks / rows.
 *
 * Tiles: the layout in gguf_q8_tiles.h (gemm_kquant.c reads them too, for many rows).
 * Integer dot products, by what the build has:
 *   AVX512-VNNI  VPDPBUSD (u8 x s8 -> s32, 4 products a lane). Q4_1's qw are u8 already; Q8_0's and INT8's
 *                are made u8 by qw ^ 0x80 = qw + 128, and the lanes start at -16 sum(qx) (8 lanes a block)
 *                to take the excess 128 sum(qx) back out.
 *   AVX512BW     VPMADDUBSW + VPMADDWD: Q8_0 / INT8 as |qw| x (qx with qw's sign) (|pair| <= 2 128 127 <
 *                2^15: never saturates), Q4_1 as qw x qx.
 *   AVX2         the same on 256-bit vectors, a block a step; plain C otherwise.
 * Figures (M = 1, against gemv.c's float sums): docs/PERFORMANCE.md#quantized-linears.
 * AVX-512 lanes: a row's vector holds its two blocks (lanes 0-7 block 2p, 8-15 block 2p + 1).
 * Work split: tiles over the OpenMP threads (contiguous ranges), inputs in groups of <= 4.
 */
#include "common.h"
#include "gguf_q8_tiles.h"
#include "kernels.h"

#define Q8_MAX_M 16
#define Q8_GROUP 4

/* The quantized activations, blocks padded to an even count nbp: row m's block b at [m * nbp + b]. */
typedef struct {
    int8_t *q;     /* [M, nbp * 32] */
    float *d;      /* [M, nbp] dx */
    int32_t *corr; /* [M, nbp] -16 sum(qx): Q8_0's VNNI start value per lane */
    float *sx;     /* [M, nbp] sum(x): Q4_1's mw term */
    int64_t nbp;
} q8_act;

/* one block of 32 activations (bf16 or float32) -> q8, rounded to nearest even */
static inline void quantize_block(const void *x, int bf16, int8_t *q, float *d, int32_t *corr, float *sx) {
#if defined(__AVX512F__)
    __m512 a, b;
    if (bf16) {
        a = load16_bf16((const uint16_t *)x), b = load16_bf16((const uint16_t *)x + 16);
    } else {
        a = _mm512_loadu_ps((const float *)x), b = _mm512_loadu_ps((const float *)x + 16);
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const float sum = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
    const __m512 id = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, id)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, id));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(qb));
    const int32_t s = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
#else
    float v[32], amax = 0.f, sum = 0.f;
    for (int j = 0; j < 32; j++) {
        v[j] = bf16 ? bf16_to_f32(((const uint16_t *)x)[j]) : ((const float *)x)[j];
        amax = fabsf(v[j]) > amax ? fabsf(v[j]) : amax;
        sum += v[j];
    }
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    int32_t s = 0;
    for (int j = 0; j < 32; j++) {
        q[j] = (int8_t)nearbyintf(v[j] * id); /* the default rounding mode: to nearest even */
        s += q[j];
    }
#endif
    *d = amax / 127.f;
    *corr = -16 * s;
    *sx = sum;
}

/* 0, or -2 when out of memory (else free a->q after use). */
static int quantize_rows(const void *x, int bf16, int64_t M, int64_t K, q8_act *a) {
    const int64_t nb = K / 32, nbp = (nb + 1) / 2 * 2;
    a->nbp = nbp;
    a->q = (int8_t *)malloc((size_t)(M * nbp) * (32 + 3 * sizeof(float)));
    if (!a->q) return -2;
    a->d = (float *)(a->q + M * nbp * 32);
    a->corr = (int32_t *)(a->d + M * nbp);
    a->sx = (float *)(a->corr + M * nbp);
    const size_t esz = bf16 ? 2 : 4;
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nbp; b++) {
            const int64_t i = m * nbp + b;
            if (b < nb) {
                quantize_block((const char *)x + (size_t)(m * K + b * 32) * esz, bf16, a->q + i * 32, a->d + i,
                               a->corr + i, a->sx + i);
            } else { /* the padding block */
                memset(a->q + i * 32, 0, 32);
                a->d[i] = 0.f, a->corr[i] = 0, a->sx[i] = 0.f;
            }
        }
    return 0;
}

#if defined(__AVX512BW__)
/* a step's 8 dw / mw, [4 rows][2 blocks] */
static inline __m256 q4k_scales8(const uint8_t *h, const uint8_t *u8) { /* fp16 h [4] x u8 [4][2] */
    const __m256 h8 = _mm256_permutexvar_ps(_mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3),
                                            _mm256_castps128_ps256(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)h))));
    return _mm256_mul_ps(h8, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)u8))));
}
static inline __m512 q6k_dw16(const uint8_t *s) { /* d [4 rows] x sc [4 rows][4] */
    const __m512 d = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                           _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)s))));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s + 8)))));
}
static inline __m256 step_dw8(const uint8_t *s, int fmt) {
    return fmt == FMT_Q4_K ? q4k_scales8(s, s + 16) : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s));
}
static inline __m256 step_mw8(const uint8_t *s, int fmt) {
    if (fmt == FMT_Q4_K) return _mm256_sub_ps(_mm256_setzero_ps(), q4k_scales8(s + 8, s + 24));
    if (fmt == FMT_Q4_1) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 16)));
    return _mm256_mul_ps(step_dw8(s, fmt), _mm256_set1_ps(-16.f));
}

/* lanes 0-7 <- p[0], 8-15 <- p[1] (two 32-bit values) */
static inline __m512i spread_pair(const void *p) {
    const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_epi32(idx, _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)p)));
}

/* sum over each lane's 4 bytes of wa (u8) x qx (s8), added to start; neg: Q8_0's negative weights
 * (the AVX512BW path multiplies |qw| by qx with qw's sign) */
static inline __attribute__((always_inline)) __m512i dot_pair(const __m512i wa, const __mmask64 neg, const __m512i qx,
                                                              const __m512i start, const int fmt) {
#if defined(__AVX512VNNI__)
    if (fmt == FMT_Q6_K) /* |qw| x (qx with qw's sign): no per-block correction (its scales are per 16) */
        return _mm512_dpbusd_epi32(start, wa, _mm512_mask_sub_epi8(qx, neg, _mm512_setzero_si512(), qx));
    (void)neg;
    return _mm512_dpbusd_epi32(start, wa, qx);
#else
    const __m512i sx = signed_w(fmt) ? _mm512_mask_sub_epi8(qx, neg, _mm512_setzero_si512(), qx) : qx;
    return _mm512_add_epi32(start, _mm512_madd_epi16(_mm512_maddubs_epi16(wa, sx), _mm512_set1_epi16(1)));
#endif
}

/* One step (4 rows x 2 blocks) for inputs m0 .. m0 + mc - 1. acc[r][m]: 16 lanes of row r's sums;
 * macc[m] (Q4_1): lane 2r + j holds sum of mw x sx of row r's blocks 2p' + j. */
static inline __attribute__((always_inline)) void q8_step(const uint8_t *s, int64_t p, const int fmt, const q8_act *a,
                                                          int64_t m0, const int mc, __m512 acc[Q8_ROWS][Q8_GROUP],
                                                          __m256 macc[Q8_GROUP]) {
    __m512i qx[Q8_GROUP], start[Q8_GROUP];
    __m512 dx[Q8_GROUP];
    for (int m = 0; m < mc; m++) {
        const int64_t i = (m0 + m) * a->nbp + 2 * p;
        qx[m] = _mm512_loadu_si512(a->q + i * 32);
        dx[m] = _mm512_castsi512_ps(spread_pair(a->d + i));
#if defined(__AVX512VNNI__)
        start[m] = signed_w(fmt) && fmt != FMT_Q6_K ? spread_pair(a->corr + i) : _mm512_setzero_si512();
#else
        start[m] = _mm512_setzero_si512();
#endif
        if (has_min(fmt)) { /* [sx_b0, sx_b1] x 4 against the step's mw [4 rows][2 blocks] */
            const __m256 sxp = _mm256_castpd_ps(_mm256_broadcast_sd((const double *)(a->sx + i)));
            macc[m] = _mm256_fmadd_ps(step_mw8(s, fmt), sxp, macc[m]);
        }
    }
    const __m512 dall = fmt == FMT_INT8   ? _mm512_set1_ps(1.f)
                        : fmt == FMT_Q6_K ? q6k_dw16(s) /* lane 4 r + k: row r's d sc_k */
                                          : _mm512_castps256_ps512(step_dw8(s, fmt));
    for (int r = 0; r < Q8_ROWS; r++) {
        const __m512i ridx = _mm512_set_epi32(2 * r + 1, 2 * r + 1, 2 * r + 1, 2 * r + 1, 2 * r + 1, 2 * r + 1, 2 * r + 1,
                                              2 * r + 1, 2 * r, 2 * r, 2 * r, 2 * r, 2 * r, 2 * r, 2 * r, 2 * r);
        const __m512i qidx = _mm512_set_epi32(4 * r + 3, 4 * r + 3, 4 * r + 3, 4 * r + 3, 4 * r + 2, 4 * r + 2, 4 * r + 2,
                                              4 * r + 2, 4 * r + 1, 4 * r + 1, 4 * r + 1, 4 * r + 1, 4 * r, 4 * r, 4 * r, 4 * r);
        const __m512 dw = fmt == FMT_INT8 ? dall : _mm512_permutexvar_ps(fmt == FMT_Q6_K ? qidx : ridx, dall);
        __m512i wa;
        __mmask64 neg = 0;
        if (signed_w(fmt)) {
            const __m512i w = _mm512_loadu_si512(s + w_offset(fmt) + r * 64);
#if defined(__AVX512VNNI__)
            if (fmt == FMT_Q6_K) {
                wa = _mm512_abs_epi8(w);
                neg = _mm512_movepi8_mask(w);
            } else {
                wa = _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));
            }
#else
            wa = _mm512_abs_epi8(w);
            neg = _mm512_movepi8_mask(w);
#endif
        } else { /* low nibbles: block 2p (lanes 0-7), high: block 2p + 1 */
            const __m512i y = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(s + w_offset(fmt) + r * 32)));
            const __m512i shift = _mm512_set_epi64(4 * 0x0001000100010001LL, 4 * 0x0001000100010001LL,
                                                   4 * 0x0001000100010001LL, 4 * 0x0001000100010001LL, 0, 0, 0, 0);
            wa = _mm512_and_si512(_mm512_srlv_epi16(y, shift), _mm512_set1_epi8(15));
            if (fmt == FMT_Q5_0) { /* the row's 64 fifth bits: bit i is byte i's */
                uint64_t qh;
                memcpy(&qh, s + 16 + r * 8, 8);
                wa = _mm512_or_si512(wa, _mm512_maskz_mov_epi8((__mmask64)qh, _mm512_set1_epi8(16)));
            }
        }
        for (int m = 0; m < mc; m++) {
            const __m512i isum = dot_pair(wa, neg, qx[m], start[m], fmt);
            const __m512 sc = fmt == FMT_INT8 ? dx[m] : _mm512_mul_ps(dw, dx[m]);
            acc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, acc[r][m]);
        }
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
/* byte j (j < 32) = 0xff where bit j of `bits` is set, else 0 */
static inline __m256i bits_to_bytes32(uint32_t bits) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3,
                                          3, 3, 3, 3, 3);
    const __m256i mask = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf), mask);
    return _mm256_cmpeq_epi8(v, mask);
}

/* One step, a block at a time (the tile's byte layout as above). acc[r][m]: 8 lanes of row r's sums. */
static inline __attribute__((always_inline)) void q8_step(const uint8_t *s, int64_t p, const int fmt, const q8_act *a,
                                                          int64_t m0, const int mc, __m256 acc[Q8_ROWS][Q8_GROUP]) {
    const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(15);
    for (int r = 0; r < Q8_ROWS; r++) {
        __m256i y = _mm256_setzero_si256();
        if (has_min(fmt)) y = _mm256_loadu_si256((const __m256i *)(s + w_offset(fmt) + r * 32));
        for (int j = 0; j < 2; j++) {
            const float dw = step_dw(s, fmt, r, j);
            __m256i w = _mm256_setzero_si256(), wa;
            if (signed_w(fmt)) {
                w = _mm256_loadu_si256((const __m256i *)(s + w_offset(fmt) + r * 64 + j * 32));
                wa = _mm256_abs_epi8(w);
            } else {
                wa = _mm256_and_si256(j ? _mm256_srli_epi16(y, 4) : y, low);
                if (fmt == FMT_Q5_0) {
                    uint32_t qh;
                    memcpy(&qh, s + 16 + r * 8 + j * 4, 4);
                    wa = _mm256_or_si256(wa, _mm256_and_si256(bits_to_bytes32(qh), _mm256_set1_epi8(16)));
                }
            }
            /* Q6_K: lanes 0-3 sum the block's first 16 weights, 4-7 its last 16 */
            const __m256 dw8 = fmt == FMT_Q6_K ? _mm256_set_m128(_mm_set1_ps(q6k_dw(s, r, 2 * j + 1)), _mm_set1_ps(q6k_dw(s, r, 2 * j)))
                                               : _mm256_set1_ps(dw);
            for (int m = 0; m < mc; m++) {
                const int64_t i = (m0 + m) * a->nbp + 2 * p + j;
                const __m256i qx = _mm256_loadu_si256((const __m256i *)(a->q + i * 32));
                const __m256i sx = signed_w(fmt) ? _mm256_sign_epi8(qx, w) : qx;
                const __m256i isum = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, sx), ones);
                acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw8, _mm256_set1_ps(a->d[i])), acc[r][m]);
                if (has_min(fmt)) /* mw sx spread over the 8 lanes (an exact / 8) */
                    acc[r][m] = _mm256_fmadd_ps(_mm256_set1_ps(step_mw(s, fmt, r, j)),
                                                _mm256_set1_ps(a->sx[i] * 0.125f), acc[r][m]);
            }
        }
    }
}
#endif

/* tile t's 4 output rows for inputs m0 .. m0 + mc - 1 */
static inline __attribute__((always_inline)) void q8_tile(const uint8_t *tiles, const float *row_scale, const q8_act *a,
                                                          void *out, int out_bf16, int64_t N, int64_t t, int64_t m0,
                                                          const int fmt, const int mc) {
    const int64_t pairs = a->nbp / 2;
    const uint8_t *base = tiles + t * pairs * step_bytes(fmt);
    float sums[Q8_ROWS][Q8_GROUP];
#if defined(__AVX512BW__)
    __m512 acc[Q8_ROWS][Q8_GROUP];
    __m256 macc[Q8_GROUP];
    for (int m = 0; m < mc; m++) {
        macc[m] = _mm256_setzero_ps();
        for (int r = 0; r < Q8_ROWS; r++) acc[r][m] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < pairs; p++) q8_step(base + p * step_bytes(fmt), p, fmt, a, m0, mc, acc, macc);
    for (int m = 0; m < mc; m++) {
        float mt[8];
        _mm256_storeu_ps(mt, macc[m]);
        for (int r = 0; r < Q8_ROWS; r++)
            sums[r][m] = _mm512_reduce_add_ps(acc[r][m]) + (has_min(fmt) ? mt[2 * r] + mt[2 * r + 1] : 0.f);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc[Q8_ROWS][Q8_GROUP];
    for (int r = 0; r < Q8_ROWS; r++)
        for (int m = 0; m < mc; m++) acc[r][m] = _mm256_setzero_ps();
    for (int64_t p = 0; p < pairs; p++) q8_step(base + p * step_bytes(fmt), p, fmt, a, m0, mc, acc);
    for (int r = 0; r < Q8_ROWS; r++)
        for (int m = 0; m < mc; m++) sums[r][m] = hsum256(acc[r][m]);
#else
    for (int r = 0; r < Q8_ROWS; r++)
        for (int m = 0; m < mc; m++) sums[r][m] = 0.f;
    for (int64_t p = 0; p < pairs; p++) {
        const uint8_t *s = base + p * step_bytes(fmt);
        for (int r = 0; r < Q8_ROWS; r++)
            for (int j = 0; j < 2; j++) {
                const float dw = step_dw(s, fmt, r, j);
                for (int m = 0; m < mc; m++) {
                    const int64_t i = (m0 + m) * a->nbp + 2 * p + j;
                    const int8_t *qx = a->q + i * 32;
                    int32_t dot = 0;
                    if (fmt == FMT_Q6_K) { /* two scales: the block's 16-weight halves summed apart */
                        const int8_t *qw = (const int8_t *)(s + w_offset(fmt) + r * 64 + j * 32);
                        for (int h = 0; h < 2; h++) {
                            int32_t half = 0;
                            for (int k = 16 * h; k < 16 * h + 16; k++) half += (int32_t)qw[k] * qx[k];
                            sums[r][m] += (float)half * (q6k_dw(s, r, 2 * j + h) * a->d[i]);
                        }
                    } else if (signed_w(fmt)) {
                        const int8_t *qw = (const int8_t *)(s + w_offset(fmt) + r * 64 + j * 32);
                        for (int k = 0; k < 32; k++) dot += (int32_t)qw[k] * qx[k];
                    } else {
                        const uint8_t *y = s + w_offset(fmt) + r * 32;
                        uint32_t qh = 0;
                        if (fmt == FMT_Q5_0) memcpy(&qh, s + 16 + r * 8 + j * 4, 4);
                        for (int k = 0; k < 32; k++)
                            dot += (int32_t)(((y[k] >> (4 * j)) & 15) | (((qh >> k) & 1) << 4)) * qx[k];
                    }
                    sums[r][m] += (float)dot * (dw * a->d[i]);
                    if (has_min(fmt)) sums[r][m] += step_mw(s, fmt, r, j) * a->sx[i];
                }
            }
    }
#endif
    for (int r = 0; r < Q8_ROWS && t * Q8_ROWS + r < N; r++)
        for (int m = 0; m < mc; m++) {
            const int64_t o = (m0 + m) * N + t * Q8_ROWS + r;
            const float v = fmt == FMT_INT8 ? sums[r][m] * row_scale[t * Q8_ROWS + r] : sums[r][m];
            if (out_bf16)
                ((uint16_t *)out)[o] = f32_to_bf16(v);
            else
                ((float *)out)[o] = v;
        }
}

#define Q8_GROUP_CASES(fmt)                                                                 \
    switch (M - m0 >= Q8_GROUP ? Q8_GROUP : (int)(M - m0)) { /* constant sizes unroll */   \
        case 1: q8_tile(tiles, row_scale, &a, out, out_bf16, N, t, m0, fmt, 1); break;      \
        case 2: q8_tile(tiles, row_scale, &a, out, out_bf16, N, t, m0, fmt, 2); break;      \
        case 3: q8_tile(tiles, row_scale, &a, out, out_bf16, N, t, m0, fmt, 3); break;      \
        default: q8_tile(tiles, row_scale, &a, out, out_bf16, N, t, m0, fmt, 4); break;     \
    }

static int q8_gemv(const void *x, int x_bf16, const uint8_t *tiles, int fmt, const float *row_scale, void *out,
                   int out_bf16, int64_t M, int64_t K, int64_t N) {
    if (M < 1 || M > Q8_MAX_M || K < 32 || K % 32 || N < 1) return -1;
    q8_act a;
    if (quantize_rows(x, x_bf16, M, K, &a)) return -2;
    const int64_t nt = (N + Q8_ROWS - 1) / Q8_ROWS;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < nt; t++)
        for (int64_t m0 = 0; m0 < M; m0 += Q8_GROUP) {
            if (fmt == FMT_Q8_0) {
                Q8_GROUP_CASES(FMT_Q8_0)
            } else if (fmt == FMT_Q4_1) {
                Q8_GROUP_CASES(FMT_Q4_1)
            } else if (fmt == FMT_Q5_0) {
                Q8_GROUP_CASES(FMT_Q5_0)
            } else if (fmt == FMT_Q4_K) {
                Q8_GROUP_CASES(FMT_Q4_K)
            } else if (fmt == FMT_Q6_K) {
                Q8_GROUP_CASES(FMT_Q6_K)
            } else {
                Q8_GROUP_CASES(FMT_INT8)
            }
        }
    free(a.q);
    return 0;
}

/* out [M, N] (bf16 when out_bf16, else float32) = x [M, K] (bf16 when x_bf16) @ W.T, W given as the
 * tiles above of format fmt (2 = Q4_1, 6 = Q5_0, 8 = Q8_0, 12 = Q4_K, 14 = Q6_K). -1: shapes refused (M > Q8_MAX_M,
 * K % 32, another format); -2: out of memory. */
int gguf_q8_gemv(const void *x, int x_bf16, const uint8_t *tiles, int64_t fmt, void *out, int out_bf16, int64_t M,
                 int64_t K, int64_t N) {
    if (!q8_tile_format(fmt)) return -1;
    return q8_gemv(x, x_bf16, tiles, (int)fmt, NULL, out, out_bf16, M, K, N);
}

/* The same for --quantization int8: W = Q * scale[n] (Q int8 [N, K] as INT8 tiles, scale [N] float32). */
int int8_q8_gemv(const void *x, int x_bf16, const uint8_t *tiles, const float *scale, void *out, int out_bf16,
                 int64_t M, int64_t K, int64_t N) {
    return q8_gemv(x, x_bf16, tiles, FMT_INT8, scale, out, out_bf16, M, K, N);
}
