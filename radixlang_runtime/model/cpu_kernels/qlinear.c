/*
 * Weight-only int8 linear for decode-sized batches (--quantization int8):
 *   out[m, n] = scale[n] * sum_k x[m, k] * w[n, k]      x [M, K] bf16 or float32, w [N, K] int8,
 *                                                      scale [N] float32, out [M, N] like x.
 * Decode reads every weight once per step, so it is bandwidth-bound: int8 rows are half the bytes of
 * bf16. Each output row n is one task (OpenMP over N); its int8 row is read once for all M <= 16
 * inputs (accumulators in registers), converted to float32 16 (AVX-512) or 8 (AVX2) lanes at a time,
 * sums in float32. Returns -1 when M > QLINEAR_MAX_M (the caller dequantizes and runs a GEMM then).
 */
#include "common.h"

#define QLINEAR_MAX_M 16

static void x_to_f32(const void *x, int bf16, int64_t n, float *dst) {
    if (!bf16) {
        memcpy(dst, x, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *s = (const uint16_t *)x;
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
}

static int qlinear_int8(const void *x, int bf16, const int8_t *w, const float *scale, void *out,
                        int64_t M, int64_t K, int64_t N) {
    if (M < 1 || M > QLINEAR_MAX_M) return -1;
    float *xf = (float *)malloc((size_t)(M * K) * sizeof(float));
    if (!xf) return -2;
    x_to_f32(x, bf16, M * K, xf);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const int8_t *wr = w + n * K;
        float sums[QLINEAR_MAX_M];
        int64_t k = 0;
#if defined(__AVX512F__)
        __m512 acc[QLINEAR_MAX_M];
        for (int64_t m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
        for (; k + 16 <= K; k += 16) {
            const __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(wr + k))));
            for (int64_t m = 0; m < M; m++) acc[m] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xf + m * K + k), acc[m]);
        }
        for (int64_t m = 0; m < M; m++) sums[m] = _mm512_reduce_add_ps(acc[m]);
#elif defined(__AVX2__) && defined(__FMA__)
        __m256 acc[QLINEAR_MAX_M];
        for (int64_t m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
        for (; k + 8 <= K; k += 8) {
            const __m256 wv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(wr + k))));
            for (int64_t m = 0; m < M; m++) acc[m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xf + m * K + k), acc[m]);
        }
        for (int64_t m = 0; m < M; m++) {
            __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[m]), _mm256_extractf128_ps(acc[m], 1));
            h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            h = _mm_add_ss(h, _mm_movehdup_ps(h));
            sums[m] = _mm_cvtss_f32(h);
        }
#else
        for (int64_t m = 0; m < M; m++) sums[m] = 0.f;
#endif
        for (; k < K; k++)
            for (int64_t m = 0; m < M; m++) sums[m] += (float)wr[k] * xf[m * K + k];
        for (int64_t m = 0; m < M; m++) {
            const float v = sums[m] * scale[n];
            if (bf16)
                ((uint16_t *)out)[m * N + n] = f32_to_bf16(v);
            else
                ((float *)out)[m * N + n] = v;
        }
    }
    free(xf);
    return 0;
}

int qlinear_int8_bf16(const uint16_t *x, const int8_t *w, const float *scale, uint16_t *out,
                      int64_t M, int64_t K, int64_t N) {
    return qlinear_int8(x, 1, w, scale, out, M, K, N);
}

int qlinear_int8_f32(const float *x, const int8_t *w, const float *scale, float *out,
                     int64_t M, int64_t K, int64_t N) {
    return qlinear_int8(x, 0, w, scale, out, M, K, N);
}
