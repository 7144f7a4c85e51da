/* Activations quantized to int8 per block as llama.cpp's q8_K (blocks of 256) / q8_0 (blocks of 32), shared by
 * gemv_kquant.c (decode batches) and gemm_kquant.c (many rows): one quantizer, so both read the same qx. */
#ifndef RADIXLANG_GGUF_Q8_ACT_H
#define RADIXLANG_GGUF_Q8_ACT_H
#include "common.h"
#include "gguf_blocks.h"

/* the quantized activations: row m's chunk c at qx[m * kp + 256 c], its 16 sub-blocks' dx / sx at
 * [(m * kp + 256 c) / 16 ..] (kp = K rounded up to 256; the padding quantizes to zeros) */
typedef struct {
    int8_t *qx; /* [M, kp] */
    float *dx;  /* [M, kp / 16] the activation block's scale, per sub-block of 16 */
    float *sx;  /* [M, kp / 16] sum(x) per sub-block of 16 */
    int64_t kp;
} kq_act;

static inline float x_at(const void *x, int bf16, int64_t i) {
    return bf16 ? bf16_to_f32(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

/* need_sx: the weights' type has o terms (else sx stays zero: its sums are skipped) */
static inline int kq_quantize(const void *x, int bf16, int64_t M, int64_t K, int qx_len, int need_sx, kq_act *a) {
    const int64_t kp = (K + KQ_CHUNK - 1) / KQ_CHUNK * KQ_CHUNK;
    a->kp = kp;
    a->qx = (int8_t *)calloc((size_t)(M * kp) + (size_t)(M * kp / 16) * 2 * sizeof(float), 1);
    if (!a->qx) return -2;
    a->dx = (float *)(a->qx + M * kp);
    a->sx = a->dx + M * kp / 16;
#pragma omp parallel for schedule(static) if (M >= 8)
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < K; b += qx_len) {
            const int64_t i0 = m * K + b, o0 = m * kp + b;
#if defined(__AVX512F__) /* the same max, products and rounding (to nearest even) 16 lanes at a time */
            __m512 mx = _mm512_setzero_ps();
            for (int j = 0; j < qx_len; j += 16) {
                const __m512 v = bf16 ? load16_bf16((const uint16_t *)x + i0 + j) : _mm512_loadu_ps((const float *)x + i0 + j);
                mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
            }
            const float amax = _mm512_reduce_max_ps(mx);
#else
            float amax = 0.f;
            for (int j = 0; j < qx_len; j++) amax = fmaxf(amax, fabsf(x_at(x, bf16, i0 + j)));
#endif
            const float d = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
            for (int k = 0; k < qx_len / 16; k++) {
#if defined(__AVX512F__)
                const __m512 v = bf16 ? load16_bf16((const uint16_t *)x + i0 + 16 * k)
                                      : _mm512_loadu_ps((const float *)x + i0 + 16 * k);
                _mm_storeu_si128((__m128i *)(a->qx + o0 + 16 * k),
                                 _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(id)))));
#else
                for (int j = 16 * k; j < 16 * k + 16; j++)
                    a->qx[o0 + j] = (int8_t)nearbyintf(x_at(x, bf16, i0 + j) * id); /* to nearest even; |v id| <= 127 */
#endif
                a->dx[o0 / 16 + k] = d;
                if (need_sx) { /* in order, as a float32 sum */
                    float s = 0.f;
                    for (int j = 16 * k; j < 16 * k + 16; j++) s += x_at(x, bf16, i0 + j);
                    a->sx[o0 / 16 + k] = s;
                }
            }
        }
    return 0;
}

#endif
