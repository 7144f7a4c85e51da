/* Shared helpers of the CPU kernels: bf16 <-> float32 and a vector e^x (AVX-512). */
#ifndef RADIXLANG_CPU_COMMON_H
#define RADIXLANG_CPU_COMMON_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

static inline float bf16_to_f32(uint16_t x) {
    uint32_t u = ((uint32_t)x) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* round to nearest even (NaN payloads are not preserved) */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#ifdef __AVX512F__
/* 16 bf16 -> 16 float */
static inline __m512 load16_bf16(const uint16_t *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* 16 float -> 16 bf16, rounded as f32_to_bf16 */
static inline void store16_bf16(uint16_t *p, __m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
}

/* e^x for x in [-87, 88]: 2^(x log2 e) as 2^n * p(f), |f| <= 1/2, p a degree-6 polynomial for
 * 2^f; relative error ~2e-7. Inputs are clamped to that range. */
static inline __m512 exp512(__m512 x) {
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
#endif
