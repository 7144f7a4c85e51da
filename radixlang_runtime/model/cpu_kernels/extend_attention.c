/*
 * Extend attention, bfloat16, CPU, AVX-512 BF16: each request's new tokens attend to its cached
 * prefix (read in place from the paged pool) and causally to themselves, in one softmax.
 *
 * Shapes: q [T, *] rows with H heads of D at q + t * q_stride (element strides), k / v rows with Hkv
 * heads at k + t * k_stride / v + t * v_stride; out [T, H, D] contiguous. Request r covers rows starts[r] ..
 * starts[r] + lens[r] - 1. Query head h uses KV head h / (H / Hkv).
 * Prefix (optional: prefix_lens == NULL means none): request r's positions 0 .. prefix_lens[r] - 1 live in
 * k_pool / v_pool [Hkv, N, D] at slots req_to_token[req_rows[r] * rt_stride + pos]. New token i of r sits
 * at absolute position prefix_lens[r] + i and sees positions 0 .. prefix_lens[r] + i.
 *
 * Per (request, KV head): K is transposed once into d-pair-major [D/2][n16] (bf16 pairs), so one
 * VDPBF16PS gives 16 keys' partial dot products in its lanes: no horizontal sums. V is widened to
 * float32 once. Then per query row: scores -> softmax numerators -> P.V. Float32 math, bf16 output.
 * Returns -1 when unsupported (D % 32 != 0, D > 256, or no AVX-512 BF16): the caller falls back.
 */
#include <stdlib.h>

#include "common.h"

int extend_causal_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *k, int64_t k_stride, const uint16_t *v, int64_t v_stride,
                       const int64_t *starts, const int64_t *lens, int64_t R, int64_t H, int64_t Hkv, int64_t D,
                       float scale, uint16_t *out, const uint16_t *k_pool, const uint16_t *v_pool, int64_t N,
                       const int64_t *req_to_token, int64_t rt_stride, const int64_t *req_rows, const int64_t *prefix_lens) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    if (D % 32 != 0 || D > 256 || H % Hkv != 0) return -1;
    const int64_t G = H / Hkv, P = D / 2, J = D / 16;
    int err = 0;
#pragma omp parallel
    {
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < R * Hkv; task++) {
            const int64_t r = task / Hkv, h = task % Hkv, s = starts[r];
            const int64_t p = prefix_lens ? prefix_lens[r] : 0, n = p + lens[r]; /* n: keys (prefix + new) */
            const int64_t *slot = prefix_lens ? req_to_token + req_rows[r] * rt_stride : NULL;
            const int64_t n16 = (n + 15) / 16 * 16;
            uint32_t *kt = (uint32_t *)aligned_alloc(64, sizeof(uint32_t) * (size_t)(P * n16));
            float *vf = (float *)aligned_alloc(64, sizeof(float) * (size_t)(n * D));
            float *sc = (float *)aligned_alloc(64, sizeof(float) * (size_t)n16);
            if (!kt || !vf || !sc) {
                err = -2;
                free(kt), free(vf), free(sc);
                continue;
            }
#define KROW(l) ((l) < p ? k_pool + (h * N + slot[l]) * D : k + (s + (l) - p) * k_stride + h * D)
#define VROW(l) ((l) < p ? v_pool + (h * N + slot[l]) * D : v + (s + (l) - p) * v_stride + h * D)
            for (int64_t l = 0; l < n16; l++) {
                const uint32_t *kr = (const uint32_t *)KROW(l < n ? l : 0);
                for (int64_t pp = 0; pp < P; pp++) kt[pp * n16 + l] = l < n ? kr[pp] : 0u;
            }
            for (int64_t l = 0; l < n; l++)
                for (int64_t j = 0; j < J; j++) _mm512_storeu_ps(vf + l * D + 16 * j, load16_bf16(VROW(l) + 16 * j));
#undef KROW
#undef VROW
            for (int64_t i = 0; i < n - p; i++) {
                for (int64_t g = 0; g < G; g++) {
                    const uint32_t *qp = (const uint32_t *)(q + (s + i) * q_stride + (h * G + g) * D);
                    const int64_t L = p + i + 1;
                    for (int64_t l0 = 0; l0 < L; l0 += 16) {
                        __m512 a = _mm512_setzero_ps();
                        for (int64_t pp = 0; pp < P; pp++)
                            a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_set1_epi32((int)qp[pp]),
                                                 (__m512bh)_mm512_load_si512(kt + pp * n16 + l0));
                        _mm512_store_ps(sc + l0, _mm512_mul_ps(a, _mm512_set1_ps(scale)));
                    }
                    /* softmax numerators over 0..L-1 */
                    __m512 vm = _mm512_set1_ps(-INFINITY);
                    int64_t l = 0;
                    for (; l + 16 <= L; l += 16) vm = _mm512_max_ps(vm, _mm512_load_ps(sc + l));
                    const __mmask16 tail = (__mmask16)((1u << (L - l)) - 1u);
                    if (L - l) vm = _mm512_mask_max_ps(vm, tail, vm, _mm512_load_ps(sc + l));
                    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vm));
                    __m512 vs = _mm512_setzero_ps();
                    for (l = 0; l < L; l += 16) {
                        const __mmask16 mk = L - l >= 16 ? (__mmask16)0xFFFF : tail;
                        const __m512 e = _mm512_maskz_mov_ps(mk, exp512(_mm512_sub_ps(_mm512_load_ps(sc + l), m)));
                        _mm512_store_ps(sc + l, e);
                        vs = _mm512_add_ps(vs, e);
                    }
                    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vs));
                    __m512 acc[16];
                    for (int64_t j = 0; j < J; j++) acc[j] = _mm512_setzero_ps();
                    for (l = 0; l < L; l++) {
                        const __m512 pl = _mm512_set1_ps(sc[l]);
                        const float *vr = vf + l * D;
                        for (int64_t j = 0; j < J; j++) acc[j] = _mm512_fmadd_ps(pl, _mm512_loadu_ps(vr + 16 * j), acc[j]);
                    }
                    uint16_t *o = out + ((s + i) * H + h * G + g) * D;
                    for (int64_t j = 0; j < J; j++) store16_bf16(o + 16 * j, _mm512_mul_ps(acc[j], inv));
                }
            }
            free(kt), free(vf), free(sc);
        }
    }
    return err;
#else
    (void)q, (void)q_stride, (void)k, (void)k_stride, (void)v, (void)v_stride, (void)starts, (void)lens, (void)R, (void)H;
    (void)Hkv, (void)D, (void)scale, (void)out, (void)k_pool, (void)v_pool, (void)N, (void)req_to_token, (void)rt_stride;
    (void)req_rows, (void)prefix_lens;
    return -1;
#endif
}
