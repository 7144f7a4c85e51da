/*
 * Weight-streaming linears for decode-sized batches, one body (gemv_impl.h) per weight format:
 *   qlinear_int8_bf16 / _f32   out = (x @ w.T) * scale    w [N, K] int8, scale [N] float32 (--quantization int8)
 *   gguf_gemv_bf16 / _f32      out = x @ W.T             W: N rows of GGUF Q4_1 or Q8_0 blocks (--quantization gguf)
 * x [M, K], out [M, N] bf16 or float32 (like x); sums in float32. Returns -1 when M > GEMV_MAX_M (the
 * caller then runs a GEMM), -2 when out of memory. Weight rows go in groups of GEMV_ROWS per pass, which
 * beat one row at a time at every M, most at M = 16. (A bf16 / float32 version of the same body did not
 * beat oneDNN's packed GEMV by enough to keep a second, unpacked copy of the weights; gemv_dense.c's
 * tiles do that now.) Figures: docs/PERFORMANCE.md#quantized-linears.
 */
#include "common.h"
#include "kernels.h"

#define GEMV_MAX_M 16
#define GEMV_ROWS 4
#define GEMV_GROUP 4
#ifndef GEMV_PREFETCH_ROWS
#define GEMV_PREFETCH_ROWS 8
#endif

static float *x_to_f32(const void *x, int bf16, int64_t n) {
    float *dst = (float *)malloc((size_t)n * sizeof(float));
    if (!dst) return NULL;
    if (!bf16) {
        memcpy(dst, x, (size_t)n * sizeof(float));
        return dst;
    }
    const uint16_t *s = (const uint16_t *)x;
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
    return dst;
}

#define SCALE_OF(n) scale[n]
#define SCALE_ONE(n) 1.0f

/* int8 weights, one float32 scale per output row */
#define GEMV_NAME gemv_w_int8
#define GEMV_BLOCK_FN gemv_block_int8
#define ROW_BYTES(K) (K)
#define LOADW16(row, k) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((row) + (k)))))
#define LOADW8(row, k) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((row) + (k)))))
#define LOADW1(row, k) ((float)(int8_t)(row)[k])
#define SCALE SCALE_OF
#include "gemv_impl.h"

/* GGUF Q4_1 blocks (ggml's block_q4_1, 20 bytes per 32 weights): fp16 d, fp16 m, 16 bytes qs;
 * weight j = d * q + m with q = qs[j] & 15 (j < 16) or qs[j - 16] >> 4. */
#define Q4_1_BYTES 20
static inline float q4_1_w1(const uint8_t *row, int64_t k) {
    const uint8_t *b = row + (k >> 5) * Q4_1_BYTES;
    const int j = (int)(k & 31);
    const int q = j < 16 ? (b[4 + j] & 15) : (b[4 + j - 16] >> 4);
    return half_to_f32(b) * (float)q + half_to_f32(b + 2);
}
#if defined(__AVX512F__)
/* the fp16 at p broadcast to 16 float32 lanes, without a trip through a scalar register */
static inline __m512 half_bcast16(const uint8_t *p) {
    int16_t h;
    memcpy(&h, p, 2);
    return _mm512_cvtph_ps(_mm256_set1_epi16(h));
}
static inline __m512 q4_1_w16(const uint8_t *row, int64_t k) {
    const uint8_t *b = row + (k >> 5) * Q4_1_BYTES;
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 4)));
    q = (k & 16) ? _mm512_srli_epi32(q, 4) : _mm512_and_si512(q, _mm512_set1_epi32(15));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), half_bcast16(b), half_bcast16(b + 2));
}
/* a whole block: sum_j x_j (d q_j + m) = d (q . x) + m sum(x): one scale and one offset per block
 * instead of dequantizing 16 weights at a time, measured faster for Q4_1. (For Q8_0 the 16-at-a-time
 * path measured faster, so Q8_0 has no DOT32; docs/PERFORMANCE.md#quantized-linears.) */
static inline __attribute__((always_inline)) void q4_1_dot32(const uint8_t *row, int64_t k, const __m512 *x0,
                                                             const __m512 *x1, const __m512 *xs, __m512 *acc,
                                                             const int mc) {
    const uint8_t *b = row + (k >> 5) * Q4_1_BYTES;
    const __m512i raw = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 4)));
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(raw, _mm512_set1_epi32(15)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(raw, 4));
    const __m512 d = half_bcast16(b), mn = half_bcast16(b + 2);
    for (int m = 0; m < mc; m++) {
        const __m512 t = _mm512_fmadd_ps(hi, x1[m], _mm512_mul_ps(lo, x0[m]));
        acc[m] = _mm512_fmadd_ps(mn, xs[m], _mm512_fmadd_ps(d, t, acc[m]));
    }
}
#endif
#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 q4_1_w8(const uint8_t *row, int64_t k) {
    const uint8_t *b = row + (k >> 5) * Q4_1_BYTES;
    __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 4 + (k & 8))));
    q = (k & 16) ? _mm256_srli_epi32(q, 4) : _mm256_and_si256(q, _mm256_set1_epi32(15));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(half_to_f32(b)), _mm256_set1_ps(half_to_f32(b + 2)));
}
#endif
#define GEMV_NAME gemv_w_q4_1
#define GEMV_BLOCK_FN gemv_block_q4_1
#define DOT32 q4_1_dot32
#define ROW_BYTES(K) ((K) / 32 * Q4_1_BYTES)
#define LOADW16(row, k) q4_1_w16(row, k)
#define LOADW8(row, k) q4_1_w8(row, k)
#define LOADW1(row, k) q4_1_w1(row, k)
#define SCALE SCALE_ONE
#include "gemv_impl.h"

/* GGUF Q8_0 blocks (block_q8_0, 34 bytes per 32 weights): fp16 d, 32 int8 qs; weight j = d * qs[j]. */
#define Q8_0_BYTES 34
static inline float q8_0_w1(const uint8_t *row, int64_t k) {
    const uint8_t *b = row + (k >> 5) * Q8_0_BYTES;
    return half_to_f32(b) * (float)(int8_t)b[2 + (k & 31)];
}
#if defined(__AVX512F__)
static inline __m512 q8_0_w16(const uint8_t *row, int64_t k) {
    const uint8_t *b = row + (k >> 5) * Q8_0_BYTES;
    const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2 + (k & 16)))));
    return _mm512_mul_ps(q, half_bcast16(b));
}
#endif
#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 q8_0_w8(const uint8_t *row, int64_t k) {
    const uint8_t *b = row + (k >> 5) * Q8_0_BYTES;
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + (k & 24)))));
    return _mm256_mul_ps(q, _mm256_set1_ps(half_to_f32(b)));
}
#endif
#define GEMV_NAME gemv_w_q8_0
#define GEMV_BLOCK_FN gemv_block_q8_0
#define ROW_BYTES(K) ((K) / 32 * Q8_0_BYTES)
#define LOADW16(row, k) q8_0_w16(row, k)
#define LOADW8(row, k) q8_0_w8(row, k)
#define LOADW1(row, k) q8_0_w1(row, k)
#define SCALE SCALE_ONE
#include "gemv_impl.h"

/* GGUF block formats: out = x @ W.T, W [N, K] as rows of blocks; K % 32 == 0. fmt 2 = Q4_1, 8 = Q8_0
 * (ggml's type numbers). */
static int gguf_gemv(const void *x, int bf16, const uint8_t *w, int fmt, void *out, int64_t M, int64_t K,
                     int64_t N) {
    if (M < 1 || M > GEMV_MAX_M || K % 32 || (fmt != 2 && fmt != 8)) return -1;
    float *xf = x_to_f32(x, bf16, M * K);
    if (!xf) return -2;
    if (fmt == 2)
        gemv_w_q4_1(xf, w, NULL, NULL, out, bf16, M, K, N);
    else
        gemv_w_q8_0(xf, w, NULL, NULL, out, bf16, M, K, N);
    free(xf);
    return 0;
}

int gguf_gemv_bf16(const uint16_t *x, const uint8_t *w, int64_t fmt, uint16_t *out, int64_t M, int64_t K,
                   int64_t N) {
    return gguf_gemv(x, 1, w, (int)fmt, out, M, K, N);
}

int gguf_gemv_f32(const float *x, const uint8_t *w, int64_t fmt, float *out, int64_t M, int64_t K, int64_t N) {
    return gguf_gemv(x, 0, w, (int)fmt, out, M, K, N);
}

static int qlinear(const void *x, int bf16, const int8_t *w, const float *scale, void *out, int64_t M, int64_t K,
                   int64_t N) {
    if (M < 1 || M > GEMV_MAX_M) return -1;
    float *xf = x_to_f32(x, bf16, M * K);
    if (!xf) return -2;
    gemv_w_int8(xf, (const uint8_t *)w, scale, NULL, out, bf16, M, K, N);
    free(xf);
    return 0;
}

int qlinear_int8_bf16(const uint16_t *x, const int8_t *w, const float *scale, uint16_t *out, int64_t M, int64_t K,
                      int64_t N) {
    return qlinear(x, 1, w, scale, out, M, K, N);
}

int qlinear_int8_f32(const float *x, const int8_t *w, const float *scale, float *out, int64_t M, int64_t K,
                     int64_t N) {
    return qlinear(x, 0, w, scale, out, M, K, N);
}
