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
 * Per (request, KV head, block of queries): K is transposed once into d-pair-major [D/2][n16] (bf16
 * pairs), so one VDPBF16PS gives 16 keys' partial dot products in its lanes: no horizontal sums; V is
 * packed into key pairs [n16/2][D], so P.V is VDPBF16PS too (numerators rounded to bf16, as GPU flash
 * attention does). Per query row: scores -> softmax numerators -> P.V. Float32 sums, bf16 output.
 * Returns -1 when unsupported (D % 32 != 0, D > 256, or no AVX-512 BF16): the caller falls back.
 */
#include <stdlib.h>

#include "common.h"

#define QB 128 /* queries per task */

int extend_causal_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *k, int64_t k_stride, const uint16_t *v, int64_t v_stride,
                       const int64_t *starts, const int64_t *lens, int64_t R, int64_t H, int64_t Hkv, int64_t D,
                       float scale, uint16_t *out, const uint16_t *k_pool, const uint16_t *v_pool, int64_t N,
                       const int64_t *req_to_token, int64_t rt_stride, const int64_t *req_rows, const int64_t *prefix_lens) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    if (D % 32 != 0 || D > 256 || H % Hkv != 0) return -1;
    const int64_t G = H / Hkv, P = D / 2, J = D / 16;
    /* Tasks: (request, KV head, block of QB queries). Blocks keep both threads busy on one long prompt
     * (3 KV heads alone split 2:1 over 2 threads); a block only prepares the keys it can see. */
    int64_t *task_off = extend_task_offsets(lens, R, Hkv, QB);
    if (!task_off) return -2;
    const int64_t n_tasks = task_off[R];
    int err = 0;
#pragma omp parallel
    {
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n_tasks; task++) {
            const int64_t r = extend_task_request(task_off, R, task);
            const int64_t local = task - task_off[r], h = local % Hkv, i0 = local / Hkv * QB, s = starts[r];
            const int64_t i1 = i0 + QB < lens[r] ? i0 + QB : lens[r];
            const int64_t p = prefix_lens ? prefix_lens[r] : 0, n = p + i1; /* n: keys this block sees */
            const int64_t *slot = prefix_lens ? req_to_token + req_rows[r] * rt_stride : NULL;
            const int64_t n16 = (n + 15) / 16 * 16;
            uint32_t *kt = (uint32_t *)aligned_alloc(64, sizeof(uint32_t) * (size_t)(P * n16));
            uint32_t *vt = (uint32_t *)aligned_alloc(64, sizeof(uint32_t) * (size_t)(n16 / 2 * D));
            float *sc = (float *)aligned_alloc(64, sizeof(float) * (size_t)n16);
            uint16_t *pb = (uint16_t *)aligned_alloc(64, sizeof(uint16_t) * (size_t)n16);
            if (!kt || !vt || !sc || !pb) {
                err = -2;
                free(kt), free(vt), free(sc), free(pb);
                continue;
            }
#define KROW(l) ((l) < p ? k_pool + (h * N + slot[l]) * D : k + (s + (l) - p) * k_stride + h * D)
#define VROW(l) ((l) < p ? v_pool + (h * N + slot[l]) * D : v + (s + (l) - p) * v_stride + h * D)
            for (int64_t l = 0; l < n16; l++) {
                const uint32_t *kr = (const uint32_t *)KROW(l < n ? l : 0);
                for (int64_t pp = 0; pp < P; pp++) kt[pp * n16 + l] = l < n ? kr[pp] : 0u;
            }
            /* V as key pairs: vt[lp][d] = (v[2lp+1][d] << 16) | v[2lp][d] (bf16 bits), zero past n */
            for (int64_t lp = 0; lp < n16 / 2; lp++) {
                const uint16_t *v0 = 2 * lp < n ? VROW(2 * lp) : NULL, *v1 = 2 * lp + 1 < n ? VROW(2 * lp + 1) : NULL;
                for (int64_t d = 0; d < D; d++)
                    vt[lp * D + d] = (v1 ? (uint32_t)v1[d] << 16 : 0u) | (v0 ? v0[d] : 0u);
            }
#undef KROW
#undef VROW
            for (int64_t i = i0; i < i1; i++) {
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
                    /* P.V with VDPBF16PS over key pairs: numerators rounded to bf16 (as GPU flash
                     * attention rounds P), sums in float32. Numerators past L are zero. */
                    for (l = 0; l < L; l += 16) {
                        const __mmask16 mk = L - l >= 16 ? (__mmask16)0xFFFF : tail;
                        _mm256_store_si256((__m256i *)(pb + l),
                                           (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_mov_ps(mk, _mm512_load_ps(sc + l))));
                    }
                    const uint32_t *pp2 = (const uint32_t *)pb;
                    __m512 acc[16];
                    for (int64_t j = 0; j < J; j++) acc[j] = _mm512_setzero_ps();
                    for (int64_t lp = 0; lp < (L + 1) / 2; lp++) {
                        const __m512bh pl = (__m512bh)_mm512_set1_epi32((int)pp2[lp]);
                        const uint32_t *vr = vt + lp * D;
                        for (int64_t j = 0; j < J; j++)
                            acc[j] = _mm512_dpbf16_ps(acc[j], pl, (__m512bh)_mm512_load_si512(vr + 16 * j));
                    }
                    uint16_t *o = out + ((s + i) * H + h * G + g) * D;
                    for (int64_t j = 0; j < J; j++) store16_bf16(o + 16 * j, _mm512_mul_ps(acc[j], inv));
                }
            }
            free(kt), free(vt), free(sc), free(pb);
        }
    }
    free(task_off);
    return err;
#else
    (void)q, (void)q_stride, (void)k, (void)k_stride, (void)v, (void)v_stride, (void)starts, (void)lens, (void)R, (void)H;
    (void)Hkv, (void)D, (void)scale, (void)out, (void)k_pool, (void)v_pool, (void)N, (void)req_to_token, (void)rt_stride;
    (void)req_rows, (void)prefix_lens;
    return -1;
#endif
}
