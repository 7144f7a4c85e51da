/*
 * Linears on a GGUF file's own rows of blocks for many input rows (prefill, large decode batches; every type of
 * gguf_blocks.h), int8 activations as llama.cpp's batched matmul computes them:
 *
 *   x [M, K] quantized once per call (gguf_q8_act.h: q8_K per 256 for the K-quants and IQ4_XS, q8_0 per 32 for
 *   the others, the same qx as gemv_kquant.c), then for every (row m, weight row n):
 *   out[m, n] = sum over sub-blocks k of 16: s_k dx_k sum_16(q qx) + o_k sx_k     (gguf_blocks.h's s / o / q)
 *
 * The same sums as gemv_kquant.c (the integer dots are exact; only the float32 summation order differs), tiled
 * for many rows:
 * - a panel of KG_NT weight rows is unpacked once per call into the form the dots read (q in lane order, and
 *   each lane's scale s), then every row of x runs against it: each weight is unpacked once for all M rows;
 *   gemv_q8.c's tiles go straight from their steps into registers (kg_pack_seg);
 * - lanes (kg_seg): 16 per segment, each one scale's run of weights, its integer sum converted and scaled
 *   once: 32 weights (8 steps of 64 bytes) for the types scaled per 32, else 16;
 * - register blocking: KG_RB rows x KG_CB weight rows of accumulators, so each loaded 64 (32) bytes of
 *   weights serve KG_RB rows and each loaded activation serves KG_CB weight rows;
 * - accumulators hold one lane per 4-byte unit; the lanes are summed once per output.
 * Integer dots by what the build has (cpu_caps.kernel_cflags):
 *   AVX512-VNNI  VPDPBUSD on (q + 128) as u8 x qx, starting from -128 sum(qx) per unit (precomputed per row),
 *                so no per-pair sign step: 64 bytes a step;
 *   AVX512BW     VPMADDUBSW / VPMADDWD on |q| x (qx with q's sign: a masked negate), 64 bytes a step;
 *   AVX2         VPSIGNB / VPMADDUBSW / VPMADDWD, 32 bytes a step;
 *   plain C      int32 sums.
 * Work split: panels of weight rows over the OpenMP threads.
 */
#include "common.h"
#include "gguf_blocks.h"
#include "gguf_q8_act.h"
#include "gguf_q8_tiles.h"
#include "kernels.h"

#define KG_NT 16  /* weight rows per panel */
#define KG_META 128 /* after a segment's quants: s and o per lane (16 float32 each) */

#if defined(__AVX512BW__)
#define KG_RB 2
#define KG_CB 4
#elif defined(__AVX2__) && defined(__FMA__)
#define KG_RB 2
#define KG_CB 2
#else
#define KG_RB 2
#define KG_CB 2
#endif

/* A row of K weights runs as segments of 16 lanes: a segment of T steps of 64 bytes gives each lane 4T consecutive
 * weights of one scale (step t, lane l, byte b <- the segment's weight 4T l + 4 t + b), so every lane's integer
 * sum runs over all T steps before one conversion and one scale:
 *   T = 8  two whole chunks (512 weights), for the types with one scale per 32 weights: a lane is a block of 32;
 *   T = 4  a whole chunk (256 weights), a lane per sub-block of 16;
 *   T = 2, 1  a row's short last chunk of 5-8 / 1-4 sub-blocks: 2 / 4 lanes per sub-block.
 * off: the segment's byte offset in a column's packed stream (64 T bytes of quants, then KG_META). */
typedef struct {
    int64_t ci; /* its first chunk */
    int T;
    int64_t off;
} kg_seg;

/* the segments of a row of K weights (at most K / 256 + 1) -> seg; returns their count, *col_bytes the stream's
 * length; scale32: the type has one scale per 32 weights (pairs of whole chunks run as T = 8) */
static int64_t kg_plan(int64_t K, int scale32, kg_seg *seg, int64_t *col_bytes) {
    const int64_t nc = (K + KQ_CHUNK - 1) / KQ_CHUNK;
    int64_t n = 0, off = 0;
    for (int64_t ci = 0; ci < nc; n++) {
        const int64_t left = K - ci * KQ_CHUNK, sub = (left < KQ_CHUNK ? left : KQ_CHUNK) / 16;
        const int two = scale32 && left >= 2 * KQ_CHUNK;
        const int T = two ? 8 : sub > 8 ? 4 : sub > 4 ? 2 : 1;
        seg[n] = (kg_seg){ci, T, off};
        off += 64 * T + KG_META;
        ci += two ? 2 : 1;
    }
    *col_bytes = off;
    return n;
}

#if defined(__AVX512F__)
/* v[i]: a segment's 64 bytes i in weight order (T = 4 or 8 of them) -> dst in lane order, each 4-byte unit xor flip */
static inline __attribute__((always_inline)) void kg_lanes(__m512i *v, const int T, uint32_t flip, uint8_t *dst) {
    const __m512i x = _mm512_set1_epi32((int)flip);
    if (T == 4) { /* v[i]: lanes 4i .. 4i + 3, 4 units each: a 4 x 4 transpose inside each, then of 16-byte quarters */
        const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        __m512i h[4];
        for (int i = 0; i < 4; i++) v[i] = _mm512_permutexvar_epi32(idx, v[i]);
        h[0] = _mm512_shuffle_i32x4(v[0], v[1], 0x44), h[1] = _mm512_shuffle_i32x4(v[0], v[1], 0xEE);
        h[2] = _mm512_shuffle_i32x4(v[2], v[3], 0x44), h[3] = _mm512_shuffle_i32x4(v[2], v[3], 0xEE);
        _mm512_storeu_si512(dst, _mm512_xor_si512(_mm512_shuffle_i32x4(h[0], h[2], 0x88), x));
        _mm512_storeu_si512(dst + 64, _mm512_xor_si512(_mm512_shuffle_i32x4(h[0], h[2], 0xDD), x));
        _mm512_storeu_si512(dst + 128, _mm512_xor_si512(_mm512_shuffle_i32x4(h[1], h[3], 0x88), x));
        _mm512_storeu_si512(dst + 192, _mm512_xor_si512(_mm512_shuffle_i32x4(h[1], h[3], 0xDD), x));
        return;
    }
    /* T = 8, v[p]: lanes 2p, 2p + 1, 8 units each. Each becomes 8 qwords (unit u: the two lanes' units u), then an
     * 8 x 8 transpose of qwords: step t's qword p = v[p]'s qword t */
    const __m512i idx = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    __m512i a[8], b[8];
    for (int p = 0; p < 8; p++) v[p] = _mm512_permutexvar_epi32(idx, v[p]);
    for (int p = 0; p < 8; p += 2)
        a[p] = _mm512_unpacklo_epi64(v[p], v[p + 1]), a[p + 1] = _mm512_unpackhi_epi64(v[p], v[p + 1]);
    for (int q = 0; q < 2; q++) /* q: rows 0-3, 4-7 */
        for (int e = 0; e < 2; e++) {
            b[4 * q + 2 * e] = _mm512_shuffle_i64x2(a[4 * q + e], a[4 * q + 2 + e], 0x88);
            b[4 * q + 2 * e + 1] = _mm512_shuffle_i64x2(a[4 * q + e], a[4 * q + 2 + e], 0xDD);
        } /* b[4q + 2e + h]: quarters k of units e + 2h + 4 (k % 2), rows 4q + 2 (k / 2), + 1 */
    static const int unit_of[4][2] = {{0, 4}, {2, 6}, {1, 5}, {3, 7}}; /* b[k], b[4 + k]: 0x88 / 0xDD's units */
    for (int k = 0; k < 4; k++) {
        _mm512_storeu_si512(dst + 64 * unit_of[k][0], _mm512_xor_si512(_mm512_shuffle_i64x2(b[k], b[4 + k], 0x88), x));
        _mm512_storeu_si512(dst + 64 * unit_of[k][1], _mm512_xor_si512(_mm512_shuffle_i64x2(b[k], b[4 + k], 0xDD), x));
    }
}
#endif

/* src (a segment's 64 T bytes in weight order) -> dst in lane order (unit 16 t + l <- unit T l + t), each 4-byte
 * unit xor `flip` */
static inline __attribute__((always_inline)) void kg_permute(const int8_t *src, uint8_t *dst, const int T,
                                                            uint32_t flip) {
#if defined(__AVX512F__)
    if (T >= 4) {
        __m512i v[8];
        for (int i = 0; i < T; i++) v[i] = _mm512_loadu_si512(src + 64 * i);
        kg_lanes(v, T, flip, dst);
        return;
    }
#endif
    for (int t = 0; t < T; t++)
        for (int l = 0; l < 16; l++) {
            uint32_t v;
            memcpy(&v, src + 4 * (T * l + t), 4);
            v ^= flip;
            memcpy(dst + 4 * (16 * t + l), &v, 4);
        }
}

/* the activations in lane order: qx (row m's segment at m kp + 256 ci), and per segment and lane the lane's dx, its
 * sum(x) (on the first lane of a sub-block only) and -128 sum(qx) over the lane's bytes (VNNI's offset) */
typedef struct {
    int8_t *qx;    /* [Mp, kp] */
    float *dl;     /* [Mp, ns, 16] */
    float *sl;     /* [Mp, ns, 16] */
    int32_t *corr; /* [Mp, ns, 16] */
    int64_t kp, ns;
} kg_act;

static int kg_prepare_act(const void *x, int x_bf16, int64_t M, int64_t Mp, int64_t K, int qx_len, int mins,
                          const kg_seg *seg, int64_t ns, kg_act *g) {
    kq_act a; /* rows M .. Mp - 1 stay zeros (a whole row tile) */
    if (kq_quantize(x, x_bf16, M, K, qx_len, mins, &a)) return -2;
    const int64_t kp = a.kp;
    g->kp = kp, g->ns = ns;
    g->qx = (int8_t *)calloc((size_t)(Mp * kp) + (size_t)(Mp * ns * 16) * (2 * sizeof(float) + sizeof(int32_t)), 1);
    if (!g->qx) {
        free(a.qx);
        return -2;
    }
    g->dl = (float *)(g->qx + Mp * kp);
    g->sl = g->dl + Mp * ns * 16;
    g->corr = (int32_t *)(g->sl + Mp * ns * 16);
#pragma omp parallel for schedule(static) if (M >= 8)
    for (int64_t m = 0; m < M; m++)
        for (int64_t si = 0; si < ns; si++) {
            const int T = seg[si].T, nsub = T > 4 ? T / 4 : 1; /* sub-blocks of 16 per lane */
            const int64_t o = m * kp + seg[si].ci * KQ_CHUNK, lo = (m * ns + si) * 16;
            int8_t *dst = g->qx + o;
            switch (T) { /* constant step counts: the permutes unroll */
                case 8: kg_permute(a.qx + o, (uint8_t *)dst, 8, 0); break;
                case 4: kg_permute(a.qx + o, (uint8_t *)dst, 4, 0); break;
                case 2: kg_permute(a.qx + o, (uint8_t *)dst, 2, 0); break;
                default: kg_permute(a.qx + o, (uint8_t *)dst, 1, 0);
            }
#if defined(__AVX512BW__) /* each lane's sum of its 4T bytes: 16 lanes a step */
            __m512i sum = _mm512_setzero_si512();
            for (int t = 0; t < T; t++)
                sum = _mm512_add_epi32(sum, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_set1_epi8(1),
                                                                                   _mm512_loadu_si512(dst + 64 * t)),
                                                              _mm512_set1_epi16(1)));
            _mm512_storeu_si512(g->corr + lo, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
#else
            for (int l = 0; l < 16; l++) {
                int32_t sum = 0;
                for (int t = 0; t < T; t++)
                    for (int b = 0; b < 4; b++) sum += dst[64 * t + 4 * l + b];
                g->corr[lo + l] = -128 * sum;
            }
#endif
            for (int l = 0; l < 16; l++) {
                const int64_t k = o / 16 + T * l / 4; /* the lane's first sub-block */
                float sx = 0.f;
                for (int j = 0; j < nsub; j++) sx += a.sx[k + j];
                g->dl[lo + l] = a.dx[k];
                g->sl[lo + l] = (T * l) % 4 ? 0.f : sx;
            }
        }
    free(a.qx);
    return 0;
}

/* the weights a call reads: the file's rows of blocks of ggml type `type`, or (tiles) gguf_q8_tiles of format `type` */
typedef struct {
    const uint8_t *w;
    int64_t type, row_bytes;
    int tiles;
} kg_weights;

static inline void kg_read_chunk(const kg_weights *src, int64_t K, int64_t n, int64_t ci, kq_chunk *c) {
    if (src->tiles)
        q8_tile_read_chunk(src->w, (int)src->type, K, n, ci, c);
    else
        kq_read_chunk(src->w + n * src->row_bytes, src->type, K, ci, c);
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define KG_FLIP 0x80808080u /* VNNI reads q + 128 as u8 */
#else
#define KG_FLIP 0u
#endif

/* weight row n's segment sg (of T steps) -> dst: its quants in lane order (VNNI: q + 128 as u8), then s and o per
 * lane */
static inline __attribute__((always_inline)) void kg_pack_seg_t(const kg_weights *src, int64_t K, int64_t n,
                                                               const kg_seg *sg, uint8_t *dst, const int T) {
    float *sl = (float *)(dst + 64 * T), *ol = sl + 16;
#if defined(__AVX512BW__)
    if (src->tiles && T >= 4 && K - sg->ci * KQ_CHUNK >= 64 * T) { /* whole chunks of tiles: pairs into registers */
        const int fmt = (int)src->type, np = T == 8 ? 8 : 4;
        const int64_t pairs = (K / 32 + 1) / 2, t = n / Q8_ROWS, stb = step_bytes(fmt);
        const int r = (int)(n % Q8_ROWS);
        __m512i v[8];
        float s4[8][4], o4[8][4];
        for (int p = 0; p < np; p++) {
            const uint8_t *st = src->w + (t * pairs + 4 * sg->ci + p) * stb;
            v[p] = q8_tile_pair_q(st, fmt, r);
            q8_tile_pair_scales(st, fmt, r, s4[p], o4[p]);
        }
        kg_lanes(v, T, KG_FLIP, dst);
        for (int l = 0; l < 16; l++) { /* T = 8: lane l is block l (pair l / 2); T = 4: sub-block l (pair l / 4) */
            const int p = T == 8 ? l / 2 : l / 4, k = T == 8 ? 2 * (l % 2) : l % 4;
            sl[l] = s4[p][k], ol[l] = o4[p][k];
        }
        return;
    }
#endif
    kq_chunk c[2];
    int8_t q[2 * KQ_CHUNK];
    kg_read_chunk(src, K, n, sg->ci, &c[0]);
    if (T == 8) {
        kg_read_chunk(src, K, n, sg->ci + 1, &c[1]);
        memcpy(q, c[0].q, KQ_CHUNK);
        memcpy(q + KQ_CHUNK, c[1].q, KQ_CHUNK);
    }
    kg_permute(T == 8 ? q : c[0].q, dst, T, KG_FLIP);
    for (int l = 0; l < 16; l++) {
        const int k = T * l / 4; /* the lane's (first) sub-block of the segment */
        sl[l] = c[k / 16].s[k % 16], ol[l] = c[k / 16].o[k % 16];
    }
}

static void kg_pack_seg(const kg_weights *src, int64_t K, int64_t n, const kg_seg *sg, uint8_t *dst) {
    switch (sg->T) { /* constant step counts: the loops unroll, the vectors stay in registers */
        case 8: kg_pack_seg_t(src, K, n, sg, dst, 8); break;
        case 4: kg_pack_seg_t(src, K, n, sg, dst, 4); break;
        case 2: kg_pack_seg_t(src, K, n, sg, dst, 2); break;
        default: kg_pack_seg_t(src, K, n, sg, dst, 1);
    }
}

/* one chunk of a tile: acc[r][j] += rows r against panel columns j; w[j]: the column's packed chunk; qx[r] /
 * dl[r] / sl[r] / corr[r]: the row's chunk; T steps of 64 bytes; mins: the type has o (else its term is skipped) */
#if defined(__AVX512BW__)
typedef __m512 kg_acc;
static inline kg_acc kg_zero(void) { return _mm512_setzero_ps(); }

static inline float kg_sum(kg_acc a) { return _mm512_reduce_add_ps(a); }

static inline __attribute__((always_inline)) void kg_tile_chunk(const uint8_t *const *w, const int8_t *const *qx, const float *const *dl,
                                 const float *const *sl, const int32_t *const *corr, int T, int mins,
                                 kg_acc acc[KG_RB][KG_CB]) {
#if !defined(__AVX512VNNI__) /* VPMADDUBSW on |q| x (qx with q's sign), each weight vector's sign taken once */
    __m512i isums[KG_RB][KG_CB];
    const __m512i ones = _mm512_set1_epi16(1);
#pragma GCC unroll 8
    for (int r = 0; r < KG_RB; r++)
#pragma GCC unroll 8
        for (int j = 0; j < KG_CB; j++) isums[r][j] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
#pragma GCC unroll 8
        for (int j = 0; j < KG_CB; j++) {
            const __m512i wv = _mm512_loadu_si512(w[j] + 64 * t), wa = _mm512_abs_epi8(wv);
            const __mmask64 neg = _mm512_movepi8_mask(wv);
#pragma GCC unroll 8
            for (int r = 0; r < KG_RB; r++) {
                const __m512i y = _mm512_loadu_si512(qx[r] + 64 * t);
                const __m512i sy = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
                isums[r][j] = _mm512_add_epi32(isums[r][j], _mm512_madd_epi16(_mm512_maddubs_epi16(wa, sy), ones));
            }
        }
    (void)corr;
#endif
#if defined(__AVX512VNNI__) /* all KG_RB x KG_CB sums live: each weight vector loaded once for the KG_RB rows */
    __m512i isums[KG_RB][KG_CB];
#pragma GCC unroll 8
    for (int r = 0; r < KG_RB; r++) {
        const __m512i c0 = _mm512_loadu_si512(corr[r]);
#pragma GCC unroll 8
        for (int j = 0; j < KG_CB; j++) isums[r][j] = c0;
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        __m512i y[KG_RB];
#pragma GCC unroll 8
        for (int r = 0; r < KG_RB; r++) y[r] = _mm512_loadu_si512(qx[r] + 64 * t);
#pragma GCC unroll 8
        for (int j = 0; j < KG_CB; j++) {
            const __m512i wv = _mm512_loadu_si512(w[j] + 64 * t);
#pragma GCC unroll 8
            for (int r = 0; r < KG_RB; r++) isums[r][j] = _mm512_dpbusd_epi32(isums[r][j], wv, y[r]);
        }
    }
#endif
#pragma GCC unroll 8
    for (int r = 0; r < KG_RB; r++) {
        const __m512i *isum = isums[r];
        const __m512 d = _mm512_loadu_ps(dl[r]);
#pragma GCC unroll 8
        for (int j = 0; j < KG_CB; j++) {
            const __m512 s = _mm512_loadu_ps((const float *)(w[j] + 64 * T));
            acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_mul_ps(s, d), acc[r][j]);
        }
        if (mins) {
            const __m512 sx = _mm512_loadu_ps(sl[r]);
#pragma GCC unroll 8
            for (int j = 0; j < KG_CB; j++)
                acc[r][j] = _mm512_fmadd_ps(_mm512_loadu_ps((const float *)(w[j] + 64 * T) + 16), sx, acc[r][j]);
        }
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 kg_acc;
static inline kg_acc kg_zero(void) { return _mm256_setzero_ps(); }
static inline float kg_sum(kg_acc a) { return hsum256(a); }

static inline __attribute__((always_inline)) void kg_tile_chunk(const uint8_t *const *w, const int8_t *const *qx, const float *const *dl,
                                 const float *const *sl, const int32_t *const *corr, int T, int mins,
                                 kg_acc acc[KG_RB][KG_CB]) {
    (void)corr;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < KG_RB; r++)
        for (int j = 0; j < KG_CB; j++) {
            __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256(); /* lanes 0-7, 8-15 */
            for (int t = 0; t < T; t++) {
                const __m256i w0 = _mm256_loadu_si256((const __m256i *)(w[j] + 64 * t));
                const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w[j] + 64 * t + 32));
                const __m256i y0 = _mm256_loadu_si256((const __m256i *)(qx[r] + 64 * t));
                const __m256i y1 = _mm256_loadu_si256((const __m256i *)(qx[r] + 64 * t + 32));
                lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w0),
                                                                                 _mm256_sign_epi8(y0, w0)), ones));
                hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w1),
                                                                                 _mm256_sign_epi8(y1, w1)), ones));
            }
            const float *s = (const float *)(w[j] + 64 * T);
            acc[r][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(_mm256_loadu_ps(s), _mm256_loadu_ps(dl[r])),
                                        acc[r][j]);
            acc[r][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi),
                                        _mm256_mul_ps(_mm256_loadu_ps(s + 8), _mm256_loadu_ps(dl[r] + 8)), acc[r][j]);
            if (mins) {
                acc[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(s + 16), _mm256_loadu_ps(sl[r]), acc[r][j]);
                acc[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(s + 24), _mm256_loadu_ps(sl[r] + 8), acc[r][j]);
            }
        }
}
#else
typedef float kg_acc;
static inline kg_acc kg_zero(void) { return 0.f; }
static inline float kg_sum(kg_acc a) { return a; }

static inline __attribute__((always_inline)) void kg_tile_chunk(const uint8_t *const *w, const int8_t *const *qx, const float *const *dl,
                                 const float *const *sl, const int32_t *const *corr, int T, int mins,
                                 kg_acc acc[KG_RB][KG_CB]) {
    (void)corr;
    for (int r = 0; r < KG_RB; r++)
        for (int j = 0; j < KG_CB; j++) {
            const int8_t *q = (const int8_t *)w[j];
            const float *s = (const float *)(w[j] + 64 * T);
            for (int l = 0; l < 16; l++) {
                int32_t isum = 0;
                for (int t = 0; t < T; t++)
                    for (int b = 0; b < 4; b++) isum += (int32_t)q[64 * t + 4 * l + b] * qx[r][64 * t + 4 * l + b];
                acc[r][j] += (float)isum * (s[l] * dl[r][l]);
                if (mins) acc[r][j] += s[16 + l] * sl[r][l];
            }
        }
}
#endif

/* rows m0 .. m0 + KG_RB of the activations against panel columns (from `panel`, col_bytes apart) n0 .. n0 + KG_CB
 * -> out */
static inline __attribute__((always_inline)) void kg_tile(const uint8_t *panel, int64_t col_bytes, const kg_seg *seg, int mins, const kg_act *g, int64_t m0,
                    int64_t M, int64_t n0, int64_t N, void *out, int out_bf16, int64_t ldo) {
    kg_acc acc[KG_RB][KG_CB];
#pragma GCC unroll 8
    for (int r = 0; r < KG_RB; r++)
#pragma GCC unroll 8
        for (int j = 0; j < KG_CB; j++) acc[r][j] = kg_zero();
    const int64_t kp = g->kp, ns = g->ns;
    for (int64_t si = 0; si < ns; si++) {
        const uint8_t *w[KG_CB];
        const int8_t *qx[KG_RB];
        const float *dl[KG_RB], *sl[KG_RB];
        const int32_t *corr[KG_RB];
#pragma GCC unroll 8
        for (int j = 0; j < KG_CB; j++) w[j] = panel + j * col_bytes + seg[si].off;
#pragma GCC unroll 8
        for (int r = 0; r < KG_RB; r++) {
            const int64_t lo = ((m0 + r) * ns + si) * 16;
            qx[r] = g->qx + (m0 + r) * kp + seg[si].ci * KQ_CHUNK, dl[r] = g->dl + lo, sl[r] = g->sl + lo;
            corr[r] = g->corr + lo;
        }
        switch (seg[si].T) { /* constant step counts: the micro-kernel's loops unroll, acc stays in registers */
            case 8: kg_tile_chunk(w, qx, dl, sl, corr, 8, mins, acc); break;
            case 4: kg_tile_chunk(w, qx, dl, sl, corr, 4, mins, acc); break;
            case 2: kg_tile_chunk(w, qx, dl, sl, corr, 2, mins, acc); break;
            default: kg_tile_chunk(w, qx, dl, sl, corr, 1, mins, acc);
        }
    }
    for (int r = 0; r < KG_RB && m0 + r < M; r++)
        for (int j = 0; j < KG_CB && n0 + j < N; j++) {
            const float v = kg_sum(acc[r][j]);
            const int64_t i = (m0 + r) * ldo + n0 + j;
            if (out_bf16)
                ((uint16_t *)out)[i] = f32_to_bf16(v);
            else
                ((float *)out)[i] = v;
        }
}

/* x's rows quantized per qx_len (32: q8_0, 256: q8_K) against the weights of src; mins: the type has o terms;
 * scale32: one scale per 32 weights */
static int kg_gemm(const void *x, int x_bf16, const kg_weights *src, int qx_len, int mins, int scale32, void *out,
                   int out_bf16, int64_t M, int64_t K, int64_t N, int64_t ldo) {
    const int64_t Mp = (M + KG_RB - 1) / KG_RB * KG_RB, npanels = (N + KG_NT - 1) / KG_NT;
    kg_seg *seg = (kg_seg *)malloc((size_t)(K / KQ_CHUNK + 1) * sizeof(kg_seg));
    if (!seg) return -2;
    int64_t col_bytes;
    const int64_t ns = kg_plan(K, scale32, seg, &col_bytes);
    kg_act g;
    if (kg_prepare_act(x, x_bf16, M, Mp, K, qx_len, mins, seg, ns, &g)) {
        free(seg);
        return -2;
    }
    int rc = 0;
#pragma omp parallel
    {
        uint8_t *panel = (uint8_t *)aligned_alloc(64, (size_t)(KG_NT * col_bytes));
        if (!panel) {
#pragma omp atomic write
            rc = -2;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t p = 0; p < npanels; p++) {
            if (!panel) continue;
            const int64_t n0 = p * KG_NT, ncols = N - n0 < KG_NT ? N - n0 : KG_NT;
            for (int j = 0; j < KG_NT; j++) {
                uint8_t *col = panel + j * col_bytes;
                if (j >= ncols) {
                    memset(col, 0, (size_t)col_bytes);
                    continue;
                }
                for (int64_t si = 0; si < ns; si++) kg_pack_seg(src, K, n0 + j, &seg[si], col + seg[si].off);
            }
            for (int64_t m0 = 0; m0 < Mp; m0 += KG_RB) /* the panel stays in L1, each row tile read once */
                for (int64_t j0 = 0; j0 < ncols; j0 += KG_CB)
                    kg_tile(panel + j0 * col_bytes, col_bytes, seg, mins, &g, m0, M, n0 + j0, N, out, out_bf16, ldo);
        }
        free(panel);
    }
    free(seg);
    free(g.qx);
    return rc;
}

/* out [M, ldo] (columns 0 .. N; bf16 when out_bf16, else float32) = x [M, K] (bf16 when x_bf16) @ W.T, W: N rows
 * of GGUF blocks of ggml type `type`, each K / QK * bytes long. Any M >= 1. -1: refused (a type not read here, K
 * not a multiple of the block length, ldo < N); -2: out of memory. */
int gguf_kq_gemm(const void *x, int x_bf16, const uint8_t *w, int64_t type, void *out, int out_bf16, int64_t M,
                 int64_t K, int64_t N, int64_t ldo) {
    const int qk = gguf_block_len(type);
    if (!qk || K < qk || K % qk || M < 1 || N < 1 || ldo < N) return -1;
    const kg_weights src = {w, type, K / qk * gguf_block_bytes(type), 0};
    return kg_gemm(x, x_bf16, &src, qk == KQ_CHUNK ? KQ_CHUNK : 32, gguf_has_mins(type), gguf_scale_len(type) == 32, out,
                   out_bf16, M, K, N, ldo);
}

/* The same on N rows held as gguf_q8_tiles of format fmt (2 = Q4_1, 6 = Q5_0, 8 = Q8_0, 12 = Q4_K, 14 = Q6_K), the
 * activations quantized per block of 32 (q8_0, as gemv_q8.c; the K-quants too). -1: refused
 * (another format, K % 32, K-quant formats with K % 256, ldo < N); -2: out of memory. */
int gguf_q8_tiles_gemm(const void *x, int x_bf16, const uint8_t *tiles, int64_t fmt, void *out, int out_bf16,
                       int64_t M, int64_t K, int64_t N, int64_t ldo) {
    const int kquant = fmt == FMT_Q4_K || fmt == FMT_Q6_K;
    if (!q8_tile_format(fmt) || K < 32 || K % 32 || (kquant && K % KQ_CHUNK) || M < 1 || N < 1 || ldo < N) return -1;
    const kg_weights src = {tiles, fmt, 0, 1};
    return kg_gemm(x, x_bf16, &src, 32, tile_mins((int)fmt), fmt != FMT_Q6_K, out, out_bf16, M, K, N, ldo);
}
