/*
 * Fused elementwise kernels for the CPU paths, bf16 and float32 (AVX-512 when available, scalar otherwise).
 *
 * add_rms_norm_bf16: residual[T, H] += x[T, H] (in place, rounded to bf16 as torch's add would),
 *   out[T, H] = rms_norm(residual) * weight, statistics in float32. With x == NULL: no add.
 * silu_mul_bf16: out[T, I] = silu(gu[t, :I]) * gu[t, I:] for gu [T, 2I] (SwiGLU), float32 math.
 * Rows are spread over OpenMP threads.
 */
#include "common.h"
#include "kernels.h"

void add_rms_norm_bf16(uint16_t *residual, const uint16_t *x, const uint16_t *weight, uint16_t *out,
                       int64_t T, int64_t H, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        uint16_t *r = residual + t * H;
        const uint16_t *xr = x ? x + t * H : NULL;
        uint16_t *o = out + t * H;
        int64_t i = 0;
        float ss = 0.f;
#ifdef __AVX512F__
        if (H % 16 == 0) {
            __m512 acc = _mm512_setzero_ps();
            for (; i < H; i += 16) {
                __m512 v = load16_bf16(r + i);
                if (xr) {
                    v = _mm512_add_ps(v, load16_bf16(xr + i));
                    store16_bf16(r + i, v);
                    v = load16_bf16(r + i); /* the rounded sum, as stored */
                }
                acc = _mm512_fmadd_ps(v, v, acc);
            }
            ss = _mm512_reduce_add_ps(acc);
            const __m512 inv = _mm512_set1_ps(1.0f / sqrtf(ss / (float)H + eps));
            for (i = 0; i < H; i += 16) store16_bf16(o + i, _mm512_mul_ps(_mm512_mul_ps(load16_bf16(r + i), inv), load16_bf16(weight + i)));
            continue;
        }
#endif
        for (i = 0; i < H; i++) {
            float v = bf16_to_f32(r[i]);
            if (xr) {
                r[i] = f32_to_bf16(v + bf16_to_f32(xr[i]));
                v = bf16_to_f32(r[i]);
            }
            ss += v * v;
        }
        const float inv = 1.0f / sqrtf(ss / (float)H + eps);
        for (i = 0; i < H; i++) o[i] = f32_to_bf16(bf16_to_f32(r[i]) * inv * bf16_to_f32(weight[i]));
    }
}

void silu_mul_bf16(const uint16_t *gu, uint16_t *out, int64_t T, int64_t I) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *g = gu + t * 2 * I, *u = g + I;
        uint16_t *o = out + t * I;
        int64_t i = 0;
#ifdef __AVX512F__
        for (; i + 16 <= I; i += 16) {
            const __m512 gv = load16_bf16(g + i);
            const __m512 sig = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
            store16_bf16(o + i, _mm512_mul_ps(_mm512_mul_ps(gv, sig), load16_bf16(u + i)));
        }
#endif
        for (; i < I; i++) {
            const float gv = bf16_to_f32(g[i]);
            o[i] = f32_to_bf16(gv / (1.0f + expf(-gv)) * bf16_to_f32(u[i]));
        }
    }
}

/* float32 versions (the default dtype on CPUs without bf16 dot products). Same contracts; the add is
 * exact float32, as torch's. Torch runs these as 5-7 separate passes over [T, H] / [T, 2I]; one pass
 * each is several times faster on a prefill chunk (docs/PERFORMANCE.md#norm-and-activation). */
void add_rms_norm_f32(float *residual, const float *x, const float *weight, float *out,
                      int64_t T, int64_t H, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        float *r = residual + t * H;
        const float *xr = x ? x + t * H : NULL;
        float *o = out + t * H;
        int64_t i = 0;
        float ss = 0.f;
#ifdef __AVX512F__
        __m512 acc = _mm512_setzero_ps();
        for (; i + 16 <= H; i += 16) {
            __m512 v = _mm512_loadu_ps(r + i);
            if (xr) {
                v = _mm512_add_ps(v, _mm512_loadu_ps(xr + i));
                _mm512_storeu_ps(r + i, v);
            }
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        ss = _mm512_reduce_add_ps(acc);
#endif
        for (; i < H; i++) {
            float v = r[i];
            if (xr) r[i] = v = v + xr[i];
            ss += v * v;
        }
        const float inv = 1.0f / sqrtf(ss / (float)H + eps);
        i = 0;
#ifdef __AVX512F__
        const __m512 vinv = _mm512_set1_ps(inv);
        for (; i + 16 <= H; i += 16)
            _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(r + i), vinv), _mm512_loadu_ps(weight + i)));
#endif
        for (; i < H; i++) o[i] = r[i] * inv * weight[i];
    }
}

void silu_mul_f32(const float *gu, float *out, int64_t T, int64_t I) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *g = gu + t * 2 * I, *u = g + I;
        float *o = out + t * I;
        int64_t i = 0;
#ifdef __AVX512F__
        for (; i + 16 <= I; i += 16) {
            const __m512 gv = _mm512_loadu_ps(g + i);
            const __m512 sig = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
            _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_mul_ps(gv, sig), _mm512_loadu_ps(u + i)));
        }
#elif defined(__AVX2__) && defined(__FMA__)
        for (; i + 8 <= I; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i);
            const __m256 sig = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < I; i++) {
            const float gv = g[i];
            o[i] = gv / (1.0f + expf(-gv)) * u[i];
        }
    }
}
