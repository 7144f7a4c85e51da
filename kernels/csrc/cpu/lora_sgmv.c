/*
 * Batched LoRA over row segments (SGMV: segmented gather matrix-vector), float32 and bf16 (body:
 * lora_sgmv_impl.h).
 *
 * lora_shrink_<dtype>: segment s covers positions j in [seg_starts[s], seg_starts[s + 1]) of the step's row
 *   list rows[]; for each: t[j, 0:r_s] = x[rows[j]] @ A_s^T, A_s = a[s] [r_s, K] row-major (the adapter's A of
 *   every sub-projection stacked); t float32.
 * lora_expand_<dtype>: task i (5 int64 in tasks: segment, column in t, rank r, output offset, output width n)
 *   adds y[rows[j], off:off + n] += t[j, col:col + r] @ Bt_i for j in its segment; Bt_i = b[i] [r, n]
 *   row-major (B transposed, the scaling folded in).
 * x, y: row strides xs, ys (elements); t: row stride ts. AVX-512F / AVX2+FMA / plain C bodies, chosen by the
 * build's target flags (cpu_caps). Returns 0, or -1 when a shape is outside the limits (a rank above
 * LORA_MAX_RANK or t's width).
 */
#include "common.h"
#include "kernels.h"

#define LORA_MAX_RANK 1024

#define LORA_T float
#define LORA_NAME(base) base##_f32
#define LOAD16(p) _mm512_loadu_ps(p)
#define LOAD8(p) _mm256_loadu_ps(p)
#define LOAD1(p) (*(p))
#define STORE16(p, v) _mm512_storeu_ps(p, v)
#define STORE8(p, v) _mm256_storeu_ps(p, v)
#define STORE1(p, f) (*(p) = (f))
#include "lora_sgmv_impl.h"

#if defined(__AVX2__) && !defined(__AVX512F__)
/* 8 bf16 -> 8 float; 8 float -> 8 bf16 rounded as f32_to_bf16 */
static inline __m256 load8_bf16(const uint16_t *p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
static inline void store8_bf16(uint16_t *p, __m256 v) {
    __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), 16);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
    _mm_storeu_si128((__m128i *)p, packed);
}
#endif

#define LORA_T uint16_t
#define LORA_NAME(base) base##_bf16
#define LOAD16(p) load16_bf16(p)
#define LOAD8(p) load8_bf16(p)
#define LOAD1(p) bf16_to_f32(*(p))
#define STORE16(p, v) store16_bf16(p, v)
#define STORE8(p, v) store8_bf16(p, v)
#define STORE1(p, f) (*(p) = f32_to_bf16(f))
#include "lora_sgmv_impl.h"
