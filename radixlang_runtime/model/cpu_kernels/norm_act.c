/*
 * Fused elementwise kernels for the bf16 CPU path (AVX-512 when available, scalar otherwise).
 *
 * add_rms_norm_bf16: residual[T, H] += x[T, H] (in place, rounded to bf16 as torch's add would),
 *   out[T, H] = rms_norm(residual) * weight, statistics in float32. With x == NULL: no add.
 * silu_mul_bf16: out[T, I] = silu(gu[t, :I]) * gu[t, I:] for gu [T, 2I] (SwiGLU), float32 math.
 * Rows are spread over OpenMP threads.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

static inline float b2f(uint16_t x) {
    uint32_t u = ((uint32_t)x) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f2b(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#ifdef __AVX512F__
static inline __m512 ld(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline void st(uint16_t *p, __m512 v) {
    /* round to nearest even, as f2b */
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
}

static inline __m512 exp512_neg(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
#endif

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
                __m512 v = ld(r + i);
                if (xr) {
                    v = _mm512_add_ps(v, ld(xr + i));
                    st(r + i, v);
                    v = ld(r + i); /* the rounded sum, as stored */
                }
                acc = _mm512_fmadd_ps(v, v, acc);
            }
            ss = _mm512_reduce_add_ps(acc);
            const __m512 inv = _mm512_set1_ps(1.0f / sqrtf(ss / (float)H + eps));
            for (i = 0; i < H; i += 16) st(o + i, _mm512_mul_ps(_mm512_mul_ps(ld(r + i), inv), ld(weight + i)));
            continue;
        }
#endif
        for (i = 0; i < H; i++) {
            float v = b2f(r[i]);
            if (xr) {
                r[i] = f2b(v + b2f(xr[i]));
                v = b2f(r[i]);
            }
            ss += v * v;
        }
        const float inv = 1.0f / sqrtf(ss / (float)H + eps);
        for (i = 0; i < H; i++) o[i] = f2b(b2f(r[i]) * inv * b2f(weight[i]));
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
            const __m512 gv = ld(g + i);
            const __m512 sig = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), exp512_neg(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
            st(o + i, _mm512_mul_ps(_mm512_mul_ps(gv, sig), ld(u + i)));
        }
#endif
        for (; i < I; i++) {
            const float gv = b2f(g[i]);
            o[i] = f2b(gv / (1.0f + expf(-gv)) * b2f(u[i]));
        }
    }
}
