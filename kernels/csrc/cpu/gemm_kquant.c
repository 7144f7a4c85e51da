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
 * - a panel of KG_NT weight rows is unpacked once per call into the form the dots read (q, and each 4-byte
 *   unit's scale s), then every row of x runs against it: each weight is unpacked once for all M rows;
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

#define KG_NT 16                                   /* weight rows per panel */
#define KG_CHUNK_BYTES (KQ_CHUNK + 16 * 4 + 16 * 4) /* q (lane order) | s per lane | o per lane */

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

/* Lane order of a chunk: 16 lanes of 4 bytes per 64-byte step; a chunk of S sub-blocks (S' = S rounded up to
 * 4, 8 or 16; only a row's short last chunk has S < 16) gives each sub-block f = 16 / S' lanes and runs
 * T = S' / 4 steps, so every lane's bytes belong to one sub-block and its integer sum runs over all T steps
 * before one conversion and one scale (step t, lane l, byte b <- weight 16 (l / f) + (l % f) 16 / f + 4 t + b) */
static inline int kg_spread(int64_t K, int64_t ci) {
    const int64_t left = K - ci * KQ_CHUNK, sub = (left < KQ_CHUNK ? left : KQ_CHUNK) / 16;
    return sub <= 4 ? 4 : sub <= 8 ? 2 : 1;
}

/* the source 4-byte unit of lane-order unit 16 t + l, per spread f (1, 2, 4 -> table 0, 1, 2) */
static int kg_units[3][64];
static void kg_init_units(void) {
    for (int fi = 0; fi < 3; fi++) {
        const int f = 1 << fi, T = 4 / f;
        for (int u = 0; u < 64; u++) kg_units[fi][u] = 0;
        for (int t = 0; t < T; t++)
            for (int l = 0; l < 16; l++) kg_units[fi][16 * t + l] = 4 * (l / f) + (l % f) * T + t;
    }
}

static inline const int *kg_unit_table(int f) { return kg_units[f == 1 ? 0 : f == 2 ? 1 : 2]; }

/* src (a chunk's 256 bytes in weight order) -> dst in lane order for spread f, each 4-byte unit xor `flip` */
static inline void kg_permute(const int8_t *src, uint8_t *dst, int f, uint32_t flip) {
#if defined(__AVX512F__)
    if (f == 1) { /* a 4 x 4 transpose of 4-byte units inside each 64 bytes, then of 16-byte quarters across them */
        const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        const __m512i x = _mm512_set1_epi32((int)flip);
        __m512i v[4], h[4];
        for (int i = 0; i < 4; i++) v[i] = _mm512_permutexvar_epi32(idx, _mm512_loadu_si512(src + 64 * i));
        h[0] = _mm512_shuffle_i32x4(v[0], v[1], 0x44), h[1] = _mm512_shuffle_i32x4(v[0], v[1], 0xEE);
        h[2] = _mm512_shuffle_i32x4(v[2], v[3], 0x44), h[3] = _mm512_shuffle_i32x4(v[2], v[3], 0xEE);
        _mm512_storeu_si512(dst, _mm512_xor_si512(_mm512_shuffle_i32x4(h[0], h[2], 0x88), x));
        _mm512_storeu_si512(dst + 64, _mm512_xor_si512(_mm512_shuffle_i32x4(h[0], h[2], 0xDD), x));
        _mm512_storeu_si512(dst + 128, _mm512_xor_si512(_mm512_shuffle_i32x4(h[1], h[3], 0x88), x));
        _mm512_storeu_si512(dst + 192, _mm512_xor_si512(_mm512_shuffle_i32x4(h[1], h[3], 0xDD), x));
        return;
    }
#endif
    const int *tab = kg_unit_table(f);
    for (int u = 0; u < 64 / f; u++) {
        uint32_t v;
        memcpy(&v, src + 4 * tab[u], 4);
        v ^= flip;
        memcpy(dst + 4 * u, &v, 4);
    }
}

/* the activations in lane order: qx, and per chunk and lane the sub-block's dx, sx (its first lane only) and
 * -128 sum(qx) over the lane's bytes (VNNI's offset) */
typedef struct {
    int8_t *qx;    /* [Mp, kp] */
    float *dl;     /* [Mp, nc, 16] */
    float *sl;     /* [Mp, nc, 16] */
    int32_t *corr; /* [Mp, nc, 16] */
    int64_t kp, nc;
} kg_act;

static int kg_prepare_act(const void *x, int x_bf16, int64_t M, int64_t Mp, int64_t K, int qx_len, int mins,
                          kg_act *g) {
    kq_act a; /* rows M .. Mp - 1 stay zeros (a whole row tile) */
    if (kq_quantize(x, x_bf16, M, K, qx_len, mins, &a)) return -2;
    const int64_t kp = a.kp, nc = kp / KQ_CHUNK;
    g->kp = kp, g->nc = nc;
    g->qx = (int8_t *)calloc((size_t)(Mp * kp) + (size_t)(Mp * nc * 16) * (2 * sizeof(float) + sizeof(int32_t)), 1);
    if (!g->qx) {
        free(a.qx);
        return -2;
    }
    g->dl = (float *)(g->qx + Mp * kp);
    g->sl = g->dl + Mp * nc * 16;
    g->corr = (int32_t *)(g->sl + Mp * nc * 16);
#pragma omp parallel for schedule(static) if (M >= 8)
    for (int64_t m = 0; m < M; m++)
        for (int64_t ci = 0; ci < nc; ci++) {
            const int f = kg_spread(K, ci), T = 4 / f;
            const int64_t o = m * kp + ci * KQ_CHUNK, lo = (m * nc + ci) * 16;
            int8_t *dst = g->qx + o;
            kg_permute(a.qx + o, (uint8_t *)dst, f, 0);
            for (int l = 0; l < 16; l++) {
                int32_t sum = 0;
                for (int t = 0; t < T; t++)
                    for (int b = 0; b < 4; b++) sum += dst[64 * t + 4 * l + b];
                g->dl[lo + l] = a.dx[o / 16 + l / f];
                g->sl[lo + l] = l % f ? 0.f : a.sx[o / 16 + l / f];
                g->corr[lo + l] = -128 * sum;
            }
        }
    free(a.qx);
    return 0;
}

/* weight row n's chunk ci -> the panel's bytes in lane order (VNNI: q + 128 as u8), s and o per lane */
static void kg_pack_chunk(const kq_chunk *c, int f, uint8_t *dst) {
    float *sl = (float *)(dst + KQ_CHUNK), *ol = sl + 16;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    kg_permute(c->q, dst, f, 0x80808080u); /* q + 128 */
#else
    kg_permute(c->q, dst, f, 0);
#endif
    if (f == 1) { /* a whole chunk: lane l is sub-block l */
        memcpy(sl, c->s, sizeof c->s);
        memcpy(ol, c->o, sizeof c->o);
        return;
    }
    for (int l = 0; l < 16; l++) sl[l] = c->s[l / f], ol[l] = c->o[l / f];
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
#pragma GCC unroll 8
    for (int r = 0; r < KG_RB; r++) {
#if defined(__AVX512VNNI__)
        __m512i isum[KG_CB];
        const __m512i c0 = _mm512_loadu_si512(corr[r]);
#pragma GCC unroll 8
        for (int j = 0; j < KG_CB; j++) isum[j] = c0;
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const __m512i y = _mm512_loadu_si512(qx[r] + 64 * t);
#pragma GCC unroll 8
            for (int j = 0; j < KG_CB; j++) isum[j] = _mm512_dpbusd_epi32(isum[j], _mm512_loadu_si512(w[j] + 64 * t), y);
        }
#else
        const __m512i *isum = isums[r];
#endif
        const __m512 d = _mm512_loadu_ps(dl[r]);
#pragma GCC unroll 8
        for (int j = 0; j < KG_CB; j++) {
            const __m512 s = _mm512_loadu_ps((const float *)(w[j] + KQ_CHUNK));
            acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_mul_ps(s, d), acc[r][j]);
        }
        if (mins) {
            const __m512 sx = _mm512_loadu_ps(sl[r]);
#pragma GCC unroll 8
            for (int j = 0; j < KG_CB; j++)
                acc[r][j] = _mm512_fmadd_ps(_mm512_loadu_ps((const float *)(w[j] + KQ_CHUNK) + 16), sx, acc[r][j]);
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
            const float *s = (const float *)(w[j] + KQ_CHUNK);
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
            const float *s = (const float *)(w[j] + KQ_CHUNK);
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

/* rows m0 .. m0 + KG_RB of the activations against panel columns (from `panel`) n0 .. n0 + KG_CB -> out */
static void kg_tile(const uint8_t *panel, const int *spread, int mins, const kg_act *g, int64_t m0, int64_t M,
                    int64_t n0, int64_t N, void *out, int out_bf16, int64_t ldo) {
    kg_acc acc[KG_RB][KG_CB];
#pragma GCC unroll 8
    for (int r = 0; r < KG_RB; r++)
#pragma GCC unroll 8
        for (int j = 0; j < KG_CB; j++) acc[r][j] = kg_zero();
    const int64_t kp = g->kp, nc = g->nc;
    for (int64_t ci = 0; ci < nc; ci++) {
        const uint8_t *w[KG_CB];
        const int8_t *qx[KG_RB];
        const float *dl[KG_RB], *sl[KG_RB];
        const int32_t *corr[KG_RB];
#pragma GCC unroll 8
        for (int j = 0; j < KG_CB; j++) w[j] = panel + (j * nc + ci) * KG_CHUNK_BYTES;
#pragma GCC unroll 8
        for (int r = 0; r < KG_RB; r++) {
            const int64_t lo = ((m0 + r) * nc + ci) * 16;
            qx[r] = g->qx + (m0 + r) * kp + ci * KQ_CHUNK, dl[r] = g->dl + lo, sl[r] = g->sl + lo, corr[r] = g->corr + lo;
        }
        switch (spread[ci]) { /* constant step counts: the micro-kernel's loops unroll, acc stays in registers */
            case 1: kg_tile_chunk(w, qx, dl, sl, corr, 4, mins, acc); break;
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

/* x's rows quantized per qx_len (32: q8_0, 256: q8_K) against the weights of src; mins: the type has o terms */
static int kg_gemm(const void *x, int x_bf16, const kg_weights *src, int qx_len, int mins, void *out, int out_bf16,
                   int64_t M, int64_t K, int64_t N, int64_t ldo) {
    const int64_t Mp = (M + KG_RB - 1) / KG_RB * KG_RB;
#pragma omp critical(kg_units)
    if (!kg_units[0][1]) kg_init_units();
    kg_act g;
    if (kg_prepare_act(x, x_bf16, M, Mp, K, qx_len, mins, &g)) return -2;
    const int64_t nc = g.nc, npanels = (N + KG_NT - 1) / KG_NT;
    int *spread = (int *)malloc((size_t)nc * sizeof(int));
    if (!spread) {
        free(g.qx);
        return -2;
    }
    for (int64_t ci = 0; ci < nc; ci++) spread[ci] = kg_spread(K, ci);
    int rc = 0;
#pragma omp parallel
    {
        uint8_t *panel = (uint8_t *)aligned_alloc(64, (size_t)(KG_NT * nc * KG_CHUNK_BYTES));
        if (!panel) {
#pragma omp atomic write
            rc = -2;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t p = 0; p < npanels; p++) {
            if (!panel) continue;
            const int64_t n0 = p * KG_NT, ncols = N - n0 < KG_NT ? N - n0 : KG_NT;
            for (int j = 0; j < KG_NT; j++)
                for (int64_t ci = 0; ci < nc; ci++) {
                    uint8_t *dst = panel + (j * nc + ci) * KG_CHUNK_BYTES;
                    if (j < ncols) {
                        kq_chunk c;
                        kg_read_chunk(src, K, n0 + j, ci, &c);
                        kg_pack_chunk(&c, spread[ci], dst);
                    } else {
                        memset(dst, 0, KG_CHUNK_BYTES);
                    }
                }
            for (int64_t m0 = 0; m0 < Mp; m0 += KG_RB) /* the panel stays in L1, each row tile read once */
                for (int64_t j0 = 0; j0 < ncols; j0 += KG_CB)
                    kg_tile(panel + j0 * nc * KG_CHUNK_BYTES, spread, mins, &g, m0, M, n0 + j0, N, out, out_bf16, ldo);
        }
        free(panel);
    }
    free(spread);
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
    return kg_gemm(x, x_bf16, &src, qk == KQ_CHUNK ? KQ_CHUNK : 32, gguf_has_mins(type), out, out_bf16, M, K, N, ldo);
}

/* The same on N rows held as gguf_q8_tiles of format fmt (2 = Q4_1, 6 = Q5_0, 8 = Q8_0, 12 = Q4_K, 14 = Q6_K), the
 * activations quantized per block of 32 (q8_0, as gemv_q8.c; the K-quants too). -1: refused
 * (another format, K % 32, K-quant formats with K % 256, ldo < N); -2: out of memory. */
int gguf_q8_tiles_gemm(const void *x, int x_bf16, const uint8_t *tiles, int64_t fmt, void *out, int out_bf16,
                       int64_t M, int64_t K, int64_t N, int64_t ldo) {
    const int kquant = fmt == FMT_Q4_K || fmt == FMT_Q6_K;
    if (!q8_tile_format(fmt) || K < 32 || K % 32 || (kquant && K % KQ_CHUNK) || M < 1 || N < 1 || ldo < N) return -1;
    const kg_weights src = {tiles, fmt, 0, 1};
    return kg_gemm(x, x_bf16, &src, 32, tile_mins((int)fmt), out, out_bf16, M, K, N, ldo);
}
