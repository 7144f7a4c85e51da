/*
 * Dense linears on a tiled copy of the weights made once at load time (cpu_ops.dense_tiles):
 *   out [M, N] = x [M, K] @ W.T (+ bias [N]), sums in float32, out like x.
 *
 * Layout (TILE = 32 output rows per tile, NT = ceil(N / 32), the last tile's missing rows are zeros):
 *   bf16     wt [NT][K / 2][32][2]: for each pair of inputs (2p, 2p + 1) the tile's 32 rows hold their
 *            two weights side by side, so one 64-byte load is 16 rows x 1 pair: one VDPBF16PS against
 *            x's pair broadcast (or, without AVX512-BF16, two FMAs on the halves of each 32-bit lane);
 *   float32  wt [NT][K][32].
 * Every tile is one contiguous run and the OpenMP threads take contiguous ranges of tiles, so a thread
 * reads one linear stream (the hardware prefetcher's best case).
 *
 * Two bodies:
 * - dense_gemm, bf16 on VDPBF16PS builds and float32 on AVX-512 builds (FMA): any M. A micro-kernel of up to GR = 6 rows x 1 or 2 tiles
 *   (one tile per task for M <= PAIRS_FROM_M, so small N still splits evenly over the threads); rows
 *   run in L2-sized blocks while the tiles pass over them. Each output is one chain of VDPBF16PS over
 *   the pairs in order, whatever M, the row's place or the task shape: rows are batch-invariant (the
 *   deterministic mode relies on it). M=1 streams at the read bandwidth (the chains of 2 - 4 outputs
 *   vectors keep ahead of memory); M = 64 beats oneDNN's packed GEMM and large M matches it (float32:
 *   both at the FMA ceiling); at M <= 16 it is equal to or better than the portable body (figures:
 *   docs/PERFORMANCE.md#cpu-linears).
 * - portable (GCC vector types, lowered to AVX-512 / AVX2 / plain code by the build's flags), bf16 and
 *   float32 below AVX-512: M <= DENSE_MAX_M, four accumulator chains per row (two halves x even / odd pairs).
 *
 * Why not oneDNN for decode: a step reads every weight once, so one stream is bandwidth-bound, and
 * oneDNN's packed GEMV streams well below a plain read's bandwidth. K must be even for bf16.
 */
#include "common.h"
#include "kernels.h"

#define DENSE_MAX_M 16
#define TILE 32
#define MG 4 /* input rows per pass over a tile: a tile is re-read (from L1 / L2) per group of 4 */
#ifndef PAIRS_FROM_M
#define PAIRS_FROM_M 4 /* dense_gemm: batches above this take two tiles per task */
#endif

typedef float dvf __attribute__((vector_size(64)));
typedef uint32_t dvu __attribute__((vector_size(64)));

static inline dvf dense_loadf(const float *p) {
    dvf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline dvu dense_loadu(const uint16_t *p) {
    dvu v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* the two bf16 halves of each 32-bit lane as float32: low half (input 2p), high half (input 2p + 1) */
static inline dvf bf16_lo(dvu v) { return (dvf)(v << 16); }
static inline dvf bf16_hi(dvu v) { return (dvf)(v & 0xFFFF0000u); }

/* res[m][0..31] = tile . x[m] for m < mc; xf [mc rows, stride xs] float32 */
static inline __attribute__((always_inline)) void tile_bf16_portable(const float *xf, int64_t xs, const uint16_t *wt,
                                                                     int64_t K, float res[MG][TILE], const int mc) {
    dvf a[MG][4];
    for (int m = 0; m < mc; m++)
        for (int c = 0; c < 4; c++) a[m][c] = (dvf){0};
    const int64_t P = K / 2;
    int64_t p = 0;
    for (; p + 2 <= P; p += 2) {
        const uint16_t *w = wt + p * 2 * TILE;
        const dvu w0 = dense_loadu(w), w1 = dense_loadu(w + 32), w2 = dense_loadu(w + 64), w3 = dense_loadu(w + 96);
        const dvf l0 = bf16_lo(w0), h0 = bf16_hi(w0), l1 = bf16_lo(w1), h1 = bf16_hi(w1);
        const dvf l2 = bf16_lo(w2), h2 = bf16_hi(w2), l3 = bf16_lo(w3), h3 = bf16_hi(w3);
        for (int m = 0; m < mc; m++) {
            const float *x = xf + m * xs + 2 * p;
            a[m][0] += l0 * x[0] + h0 * x[1];
            a[m][1] += l1 * x[0] + h1 * x[1];
            a[m][2] += l2 * x[2] + h2 * x[3];
            a[m][3] += l3 * x[2] + h3 * x[3];
        }
    }
    if (p < P) {
        const uint16_t *w = wt + p * 2 * TILE;
        const dvu w0 = dense_loadu(w), w1 = dense_loadu(w + 32);
        for (int m = 0; m < mc; m++) {
            const float *x = xf + m * xs + 2 * p;
            a[m][0] += bf16_lo(w0) * x[0] + bf16_hi(w0) * x[1];
            a[m][1] += bf16_lo(w1) * x[0] + bf16_hi(w1) * x[1];
        }
    }
    for (int m = 0; m < mc; m++) {
        const dvf lo = a[m][0] + a[m][2], hi = a[m][1] + a[m][3];
        memcpy(res[m], &lo, sizeof lo);
        memcpy(res[m] + 16, &hi, sizeof hi);
    }
}


#if defined(__AVX512F__)
/* Batches past a few rows: a GEMM micro-kernel of GR rows x two tiles (64 outputs) on the same layouts.
 * Per input pair (bf16, VDPBF16PS) or input (float32, FMA) it loads 4 weight vectors and GR broadcasts
 * for 4 x GR multiply-adds (24 independent chains: no even / odd split needed); rows run in blocks of
 * GEMM_MB that stay in L2 while every tile pair passes over them. */
#define GR 6
/* lines p .. p + lpi - 1 (below end) into L2: the next task's weights, a part per row group */
static inline __attribute__((always_inline)) void prefetch_next(const char *p, const char *end, const int64_t lpi) {
    for (int64_t c = 0; c < lpi; c++)
        if (p + 64 * c < end) _mm_prefetch(p + 64 * c, _MM_HINT_T1);
}
#if defined(__AVX512BF16__)
static inline __attribute__((always_inline)) void ukernel_dp(const uint16_t *x, int64_t xs, const uint16_t *w0,
                                                             const uint16_t *w1, int64_t K, float res[GR][2 * TILE],
                                                             const int mc, const int two, const char *pf,
                                                             const char *pf_end, const int64_t lpi) {
    __m512 a[GR][4];
    for (int m = 0; m < mc; m++)
        for (int c = 0; c < 4; c++) a[m][c] = _mm512_setzero_ps();
    const int64_t P = K / 2;
    for (int64_t p = 0; p < P; p++) {
        prefetch_next(pf + 64 * lpi * p, pf_end, lpi);
        const __m512bh v0 = (__m512bh)_mm512_loadu_si512(w0 + p * 2 * TILE);
        const __m512bh v1 = (__m512bh)_mm512_loadu_si512(w0 + p * 2 * TILE + 32);
        __m512bh v2 = v0, v3 = v1;
        if (two) {
            v2 = (__m512bh)_mm512_loadu_si512(w1 + p * 2 * TILE);
            v3 = (__m512bh)_mm512_loadu_si512(w1 + p * 2 * TILE + 32);
        }
        for (int m = 0; m < mc; m++) {
            uint32_t xp;
            memcpy(&xp, x + m * xs + 2 * p, 4);
            const __m512bh b = (__m512bh)_mm512_set1_epi32((int)xp);
            a[m][0] = _mm512_dpbf16_ps(a[m][0], v0, b);
            a[m][1] = _mm512_dpbf16_ps(a[m][1], v1, b);
            if (two) {
                a[m][2] = _mm512_dpbf16_ps(a[m][2], v2, b);
                a[m][3] = _mm512_dpbf16_ps(a[m][3], v3, b);
            }
        }
    }
    for (int m = 0; m < mc; m++)
        for (int c = 0; c < (two ? 4 : 2); c++) _mm512_storeu_ps(res[m] + 16 * c, a[m][c]);
}
#endif

static inline __attribute__((always_inline)) void ukernel_fma(const float *x, int64_t xs, const float *w0,
                                                              const float *w1, int64_t K, float res[GR][2 * TILE],
                                                              const int mc, const int two, const char *pf,
                                                              const char *pf_end, const int64_t lpi) {
    __m512 a[GR][4];
    for (int m = 0; m < mc; m++)
        for (int c = 0; c < 4; c++) a[m][c] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        prefetch_next(pf + 64 * lpi * k, pf_end, lpi);
        const __m512 v0 = _mm512_loadu_ps(w0 + k * TILE), v1 = _mm512_loadu_ps(w0 + k * TILE + 16);
        __m512 v2 = v0, v3 = v1;
        if (two) v2 = _mm512_loadu_ps(w1 + k * TILE), v3 = _mm512_loadu_ps(w1 + k * TILE + 16);
        for (int m = 0; m < mc; m++) {
            const __m512 b = _mm512_set1_ps(x[m * xs + k]);
            a[m][0] = _mm512_fmadd_ps(v0, b, a[m][0]);
            a[m][1] = _mm512_fmadd_ps(v1, b, a[m][1]);
            if (two) {
                a[m][2] = _mm512_fmadd_ps(v2, b, a[m][2]);
                a[m][3] = _mm512_fmadd_ps(v3, b, a[m][3]);
            }
        }
    }
    for (int m = 0; m < mc; m++)
        for (int c = 0; c < (two ? 4 : 2); c++) _mm512_storeu_ps(res[m] + 16 * c, a[m][c]);
}

/* the micro-kernel of x's dtype (f32: ukernel_fma; else ukernel_dp), mc and two as constants */
static inline __attribute__((always_inline)) void ukernel(const void *x, int64_t xs, const void *w0, const void *w1,
                                                          int64_t K, float res[GR][2 * TILE], const int mc,
                                                          const int two, const int f32, const char *pf,
                                                          const char *pf_end, const int64_t lpi) {
    if (f32) {
        ukernel_fma((const float *)x, xs, (const float *)w0, (const float *)w1, K, res, mc, two, pf, pf_end, lpi);
        return;
    }
#if defined(__AVX512BF16__)
    ukernel_dp((const uint16_t *)x, xs, (const uint16_t *)w0, (const uint16_t *)w1, K, res, mc, two, pf, pf_end, lpi);
#endif
}

/* out [M, N] = x [M, K] @ W.T (+ bias), W as tiles of x's dtype (f32: float32, else bf16), any M */
static inline __attribute__((always_inline)) void dense_gemm(const void *x, int64_t xs, const void *wt,
                                                             const void *bias, void *out, int64_t M, int64_t K,
                                                             int64_t N, const int f32) {
    const size_t esz = f32 ? 4 : 2;
    const int64_t NT = (N + TILE - 1) / TILE;
    const int span = M > PAIRS_FROM_M ? 2 : 1; /* tiles per task: small batches split N finer over the threads */
    const int64_t NP = (NT + span - 1) / span;
    int64_t MB = (256 * 1024 / ((int64_t)esz * K)) / GR * GR; /* a row block of x: ~256 KB */
    if (MB < GR) MB = GR;
#pragma omp parallel
    for (int64_t mb = 0; mb < M; mb += MB) {
        const int64_t me = mb + MB < M ? mb + MB : M;
        /* items (tile pair, part of the row block): S parts where the pairs don't divide evenly over the
         * threads (o / down at N = 576: 9 pairs, 5 against 4, were measurably slower), so each thread gets
         * the same rows x tiles; the pair split in parts is read by each of them */
        const int64_t nth = omp_get_num_threads(), S = NP % nth && me - mb >= 2 * GR * nth ? nth : 1;
        const int64_t part = ((me - mb + S - 1) / S + GR - 1) / GR * GR;
        /* the static schedule's chunk of this thread, so it knows its next item */
        const int64_t nitems = NP * S, tid = omp_get_thread_num(), per = nitems / nth, extra = nitems % nth;
        const int64_t i0 = tid * per + (tid < extra ? tid : extra), i1 = i0 + per + (tid < extra);
        const int64_t iters = f32 ? K : K / 2; /* micro-kernel steps: 4 weight lines each */
        for (int64_t item = i0; item < i1; item++) {
            const int64_t tp = item / S, r0 = mb + item % S * part, r1 = r0 + part < me ? r0 + part : me;
            const int64_t t = span * tp;
            const int two = span == 2 && t + 1 < NT;
            const char *w0 = (const char *)wt + t * K * TILE * esz, *w1 = w0 + K * TILE * esz;
            const int64_t n0 = t * TILE, width = (two ? 2 : 1) * TILE, nn = N - n0 < width ? N - n0 : width;
            /* The next item's tiles (this thread's next, or its first in the next row block) stream into
             * L2 during this item's row groups, lpi lines per micro-kernel step, so the groups together
             * cover them: a tile pair's first pass over its rows read it from DRAM at the stream's rate
             * while the FMAs waited. Not below 4 row groups (M = 1 / 8 were slower with it). It gains
             * most at M = 64, little at M = 512 (docs/PERFORMANCE.md#cpu-linears). */
            const int64_t nxt = item + 1 < i1 ? item + 1 : i0, nt = span * (nxt / S);
            const char *pf = (const char *)wt + nt * K * TILE * esz;
            const char *pf_end = pf + (nt + span <= NT ? span : NT - nt) * K * TILE * esz;
            const int64_t groups = (r1 - r0 + GR - 1) / GR, need = (pf_end - pf) / 64 / iters;
            const int64_t lpi = (item + 1 == i1 && me >= M) || groups < 4 ? 0 : (need + groups - 1) / groups;
            float res[GR][2 * TILE];
            for (int64_t m0 = r0; m0 < r1; m0 += GR) {
                const int mc = r1 - m0 < GR ? (int)(r1 - m0) : GR;
                const char *xm = (const char *)x + m0 * xs * esz;
                const char *pfg = pf + (m0 - r0) / GR * 64 * lpi * iters;
#define UK(c)                                                                              \
    (two ? ukernel(xm, xs, w0, w1, K, res, c, 1, f32, pfg, pf_end, lpi) \
         : ukernel(xm, xs, w0, w1, K, res, c, 0, f32, pfg, pf_end, lpi))
                switch (mc) {
                    case 1: UK(1); break;
                    case 2: UK(2); break;
                    case 3: UK(3); break;
                    case 4: UK(4); break;
                    case 5: UK(5); break;
                    default: UK(6); break;
                }
#undef UK
                for (int m = 0; m < mc; m++) {
                    int64_t j = 0;
                    if (f32) {
                        float *o = (float *)out + (m0 + m) * N + n0;
                        for (; j + 16 <= nn; j += 16) {
                            __m512 v = _mm512_loadu_ps(res[m] + j);
                            if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps((const float *)bias + n0 + j));
                            _mm512_storeu_ps(o + j, v);
                        }
                        for (; j < nn; j++) o[j] = res[m][j] + (bias ? ((const float *)bias)[n0 + j] : 0.f);
                    } else {
                        uint16_t *o = (uint16_t *)out + (m0 + m) * N + n0;
                        for (; j + 16 <= nn; j += 16) {
                            __m512 v = _mm512_loadu_ps(res[m] + j);
                            if (bias) v = _mm512_add_ps(v, load16_bf16((const uint16_t *)bias + n0 + j));
                            store16_bf16(o + j, v);
                        }
                        for (; j < nn; j++)
                            o[j] = f32_to_bf16(res[m][j] + (bias ? bf16_to_f32(((const uint16_t *)bias)[n0 + j]) : 0.f));
                    }
                }
            }
        }
    }
}
#endif

/* float32 weights: wt [K][32] per tile */
static inline __attribute__((always_inline)) void tile_f32(const float *x, int64_t xs, const float *wt, int64_t K,
                                                           float res[MG][TILE], const int mc) {
    dvf a[MG][4];
    for (int m = 0; m < mc; m++)
        for (int c = 0; c < 4; c++) a[m][c] = (dvf){0};
    int64_t k = 0;
    for (; k + 2 <= K; k += 2) {
        const float *w = wt + k * TILE;
        const dvf w0 = dense_loadf(w), w1 = dense_loadf(w + 16), w2 = dense_loadf(w + 32), w3 = dense_loadf(w + 48);
        for (int m = 0; m < mc; m++) {
            const float *xm = x + m * xs + k;
            a[m][0] += w0 * xm[0];
            a[m][1] += w1 * xm[0];
            a[m][2] += w2 * xm[1];
            a[m][3] += w3 * xm[1];
        }
    }
    if (k < K) {
        const dvf w0 = dense_loadf(wt + k * TILE), w1 = dense_loadf(wt + k * TILE + 16);
        for (int m = 0; m < mc; m++) {
            a[m][0] += w0 * x[m * xs + k];
            a[m][1] += w1 * x[m * xs + k];
        }
    }
    for (int m = 0; m < mc; m++) {
        const dvf lo = a[m][0] + a[m][2], hi = a[m][1] + a[m][3];
        memcpy(res[m], &lo, sizeof lo);
        memcpy(res[m] + 16, &hi, sizeof hi);
    }
}

/* kind 1 bf16 portable, 2 float32 without AVX-512 (kind 0 and AVX-512 float32 run dense_gemm). x rows at stride xs (elements); out [M, N] like x. */
static void dense_tile(int kind, const void *x, const float *xf, int64_t xs, const void *wt, const void *bias,
                       void *out, int64_t M, int64_t K, int64_t N, int64_t t) {
    const int64_t n0 = t * TILE, nn = N - n0 < TILE ? N - n0 : TILE;
    float res[MG][TILE];
    for (int64_t m0 = 0; m0 < M; m0 += MG) {
        const int mc = M - m0 < MG ? (int)(M - m0) : MG;
#define DENSE_CASES(CALL) \
    switch (mc) {         \
        case 1: CALL(1); break; \
        case 2: CALL(2); break; \
        case 3: CALL(3); break; \
        default: CALL(4); break; \
    }
        if (kind == 2) {
            const float *w = (const float *)wt + t * K * TILE;
#define CALL_F32(c) tile_f32((const float *)x + m0 * xs, xs, w, K, res, c)
            DENSE_CASES(CALL_F32)
        } else {
            const uint16_t *w = (const uint16_t *)wt + t * K * TILE;
#define CALL_PORT(c) tile_bf16_portable(xf + m0 * K, K, w, K, res, c)
            DENSE_CASES(CALL_PORT)
        }
#undef DENSE_CASES
#undef CALL_F32
#undef CALL_PORT
        for (int m = 0; m < mc; m++)
            for (int64_t j = 0; j < nn; j++) {
                const int64_t n = n0 + j;
                if (kind == 2) {
                    ((float *)out)[(m0 + m) * N + n] = res[m][j] + (bias ? ((const float *)bias)[n] : 0.f);
                } else {
                    const float b = bias ? bf16_to_f32(((const uint16_t *)bias)[n]) : 0.f;
                    ((uint16_t *)out)[(m0 + m) * N + n] = f32_to_bf16(res[m][j] + b);
                }
            }
    }
}

static int dense_gemv(int kind, const void *x, int64_t xs, const void *wt, const void *bias, void *out, int64_t M,
                      int64_t K, int64_t N) {
#if defined(__AVX512BF16__)
    if (kind == 0 && M >= 1 && K % 2 == 0) { /* any M: see dense_gemm */
        dense_gemm(x, xs, wt, bias, out, M, K, N, 0);
        return 0;
    }
#endif
#if defined(__AVX512F__)
    if (kind == 2 && M >= 1) { /* any M: see dense_gemm */
        dense_gemm(x, xs, wt, bias, out, M, K, N, 1);
        return 0;
    }
#endif
    if (M < 1 || M > DENSE_MAX_M || (kind != 2 && K % 2)) return -1;
    float *xf = NULL;
    if (kind == 1) { /* the portable bf16 body multiplies in float32: convert x once */
        xf = (float *)malloc((size_t)(M * K) * sizeof(float));
        if (!xf) return -2;
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) xf[m * K + k] = bf16_to_f32(((const uint16_t *)x)[m * xs + k]);
    }
    const int64_t NT = (N + TILE - 1) / TILE;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < NT; t++) dense_tile(kind, x, xf, xs, wt, bias, out, M, K, N, t);
    free(xf);
    return 0;
}

/* x [M, K] bf16 (row stride xs), wt the bf16 tiles, bias [N] bf16 or NULL -> out [M, N] bf16 */
int dense_gemv_bf16(const uint16_t *x, int64_t xs, const uint16_t *wt, const uint16_t *bias, uint16_t *out,
                    int64_t M, int64_t K, int64_t N) {
#if defined(__AVX512BF16__)
    return dense_gemv(0, x, xs, wt, bias, out, M, K, N);
#else
    return dense_gemv(1, x, xs, wt, bias, out, M, K, N);
#endif
}

/* 1 where dense_gemv_bf16 takes any M (VDPBF16PS builds: dense_gemm), else 0 (M <= DENSE_MAX_M) */
int dense_any_m_bf16(void) {
#if defined(__AVX512BF16__)
    return 1;
#else
    return 0;
#endif
}

/* 1 where dense_gemv_f32 takes any M (AVX-512 builds: dense_gemm), else 0 (M <= DENSE_MAX_M) */
int dense_any_m_f32(void) {
#if defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}

/* the portable bf16 body on any build (tests run it beside VDPBF16PS) */
int dense_gemv_portable_bf16(const uint16_t *x, int64_t xs, const uint16_t *wt, const uint16_t *bias,
                             uint16_t *out, int64_t M, int64_t K, int64_t N) {
    return dense_gemv(1, x, xs, wt, bias, out, M, K, N);
}

/* x [M, K] float32 (row stride xs), wt the float32 tiles, bias [N] float32 or NULL -> out [M, N] float32 */
int dense_gemv_f32(const float *x, int64_t xs, const float *wt, const float *bias, float *out, int64_t M, int64_t K,
                   int64_t N) {
    return dense_gemv(2, x, xs, wt, bias, out, M, K, N);
}
