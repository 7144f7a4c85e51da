/*
 * The body of paged decode attention, instantiated once per element type by decode_attention.c
 * (a C "template": define ELEM, SUFFIX, TO_F32, FROM_F32, LOAD16 and ELEM_IS_BF16, then include).
 *
 * Shapes (all contiguous):
 *   q             [B, H, D]   ELEM
 *   k_pool/v_pool [Hkv, N, D] ELEM, N = pool slots
 *   req_to_token  [rows, ctx] int64 slot of each position of each table row
 *   req_rows      [B]         int64 table row of each request
 *   seq_lens      [B]         int64 positions to attend (all already in the pool)
 *   k_begin       [B]         int64 first position to attend (NULL: 0); cascade attention's own part
 *   prior_o       [B, H, D]   ELEM, prior_lse [B, H] float32 (both NULL: none): the shared part of a
 *                             cascade, merged into the output by log-sum-exp (common.h merge_prior)
 *   out           [B, H, D]   ELEM
 * Query head h uses KV head h / (H / Hkv). Scores and accumulators are float32. One task per
 * (request, KV head), spread over OpenMP threads. Limits: D <= 256, H / Hkv <= 32 (else -1).
 */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

#ifdef __AVX512F__
/* The vector path: D % 16 == 0. Scores of one KV row for all G query heads share its load. */
static void CAT(decode_task_avx512_, SUFFIX)(const float *qf, const ELEM *qb, float scale, const ELEM *k_pool,
                                            const ELEM *v_pool, const int64_t *slots, int64_t L, int64_t G,
                                            int64_t D, int64_t h, int64_t N, float *scores, float *acc, float *lse) {
    const int64_t J = D / 16;
    (void)qb, (void)scale;
#if ELEM_IS_BF16 && defined(__AVX512BF16__)
    if (D % 32 == 0) {
        /* bf16 dot products straight from the pool (VDPBF16PS: exact products, float32 sums);
         * qb holds the G unscaled bf16 query rows, the scale is applied to the sums. */
        const int64_t P = D / 32;
        __m512bh qv[32 * 8];
        for (int64_t g = 0; g < G; g++)
            for (int64_t p = 0; p < P; p++) qv[g * P + p] = (__m512bh)_mm512_loadu_si512(qb + g * D + 32 * p);
        for (int64_t l = 0; l < L; l++) {
            const ELEM *kr = k_pool + (h * N + slots[l]) * D;
            __m512bh kv[8];
            for (int64_t p = 0; p < P; p++) kv[p] = (__m512bh)_mm512_loadu_si512(kr + 32 * p);
            for (int64_t g = 0; g < G; g++) {
                __m512 a = _mm512_setzero_ps();
                for (int64_t p = 0; p < P; p++) a = _mm512_dpbf16_ps(a, qv[g * P + p], kv[p]);
                scores[g * L + l] = _mm512_reduce_add_ps(a) * scale;
            }
        }
    } else
#endif
    for (int64_t l = 0; l < L; l++) {
        const ELEM *kr = k_pool + (h * N + slots[l]) * D;
        __m512 kv[16];
        for (int64_t j = 0; j < J; j++) kv[j] = LOAD16(kr + 16 * j);
        for (int64_t g = 0; g < G; g++) {
            const float *qg = qf + g * D;
            __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qg), kv[0]);
            for (int64_t j = 1; j < J; j++) a = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * j), kv[j], a);
            scores[g * L + l] = _mm512_reduce_add_ps(a);
        }
    }
    float inv_sum[32];
    for (int64_t g = 0; g < G; g++) {
        float m;
        const float sum = softmax_numerators(scores + g * L, L, &m);
        inv_sum[g] = 1.f / sum;
        lse[g] = m + logf(sum);
    }
    __m512 av[32 * 16];
    for (int64_t i = 0; i < G * J; i++) av[i] = _mm512_setzero_ps();
    for (int64_t l = 0; l < L; l++) {
        const ELEM *vr = v_pool + (h * N + slots[l]) * D;
        __m512 vv[16];
        for (int64_t j = 0; j < J; j++) vv[j] = LOAD16(vr + 16 * j);
        for (int64_t g = 0; g < G; g++) {
            const __m512 p = _mm512_set1_ps(scores[g * L + l]);
            for (int64_t j = 0; j < J; j++) av[g * J + j] = _mm512_fmadd_ps(p, vv[j], av[g * J + j]);
        }
    }
    for (int64_t g = 0; g < G; g++)
        for (int64_t j = 0; j < J; j++)
            _mm512_storeu_ps(acc + 16 * (g * J + j), _mm512_mul_ps(av[g * J + j], _mm512_set1_ps(inv_sum[g])));
}
#endif

/* The portable path (any D): float32 rows, loops the compiler vectorises for the target (AVX2, NEON). */
static void CAT(decode_task_portable_, SUFFIX)(const float *qf, const ELEM *k_pool, const ELEM *v_pool,
                                              const int64_t *slots, int64_t L, int64_t G, int64_t D, int64_t h,
                                              int64_t N, float *scores, float *acc, float *lse) {
    for (int64_t l = 0; l < L; l++) { /* pass 1: scores[g][l] = q_g . k_l */
        const ELEM *kr = k_pool + (h * N + slots[l]) * D;
        float kf[256];
        for (int64_t d = 0; d < D; d++) kf[d] = TO_F32(kr[d]);
        for (int64_t g = 0; g < G; g++) {
            float s = 0.f;
            const float *qg = qf + g * D;
#pragma omp simd reduction(+ : s)
            for (int64_t d = 0; d < D; d++) s += qg[d] * kf[d];
            scores[g * L + l] = s;
        }
    }
    float inv_sum[32];
    for (int64_t g = 0; g < G; g++) {
        float m;
        const float sum = softmax_numerators(scores + g * L, L, &m);
        inv_sum[g] = 1.f / sum;
        lse[g] = m + logf(sum);
    }
    memset(acc, 0, sizeof(float) * (size_t)(G * D));
    for (int64_t l = 0; l < L; l++) { /* pass 2: acc_g = sum_l p_gl v_l */
        const ELEM *vr = v_pool + (h * N + slots[l]) * D;
        float vf[256];
        for (int64_t d = 0; d < D; d++) vf[d] = TO_F32(vr[d]);
        for (int64_t g = 0; g < G; g++) {
            const float p = scores[g * L + l];
            float *ag = acc + g * D;
#pragma omp simd
            for (int64_t d = 0; d < D; d++) ag[d] += p * vf[d];
        }
    }
    for (int64_t g = 0; g < G; g++)
        for (int64_t d = 0; d < D; d++) acc[g * D + d] *= inv_sum[g];
}

int CAT(paged_decode_, SUFFIX)(const ELEM *q, const ELEM *k_pool, const ELEM *v_pool, const int64_t *req_to_token,
                               const int64_t *req_rows, const int64_t *seq_lens, const int64_t *k_begin,
                               const ELEM *prior_o, const float *prior_lse, int64_t B, int64_t H, int64_t Hkv,
                               int64_t D, int64_t N, int64_t ctx, float scale, ELEM *out) {
    const int64_t G = H / Hkv;
    if (D > 256 || G > 32 || G * Hkv != H) return -1;
    int64_t max_len = 0;
    for (int64_t b = 0; b < B; b++) max_len = seq_lens[b] > max_len ? seq_lens[b] : max_len;
    int err = 0;
#pragma omp parallel
    {
        float *scores = (float *)malloc(sizeof(float) * (size_t)(G * (max_len > 0 ? max_len : 1)));
        float qf[32 * 256];
        float acc[32 * 256];
        float lse[32], pf[256];
        /* every thread must reach the worksharing loop (its barrier), even without a buffer */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < B * Hkv; task++) {
            if (!scores) {
                err = -2;
                continue;
            }
            const int64_t b = task / Hkv, h = task % Hkv;
            const int64_t k0 = k_begin ? k_begin[b] : 0, L = seq_lens[b] - k0;
            const int64_t *slots = req_to_token + req_rows[b] * ctx + k0;
            for (int64_t g = 0; g < G; g++)
                for (int64_t d = 0; d < D; d++) qf[g * D + d] = TO_F32(q[(b * H + h * G + g) * D + d]) * scale;
#ifdef __AVX512F__
            if (D % 16 == 0)
                CAT(decode_task_avx512_, SUFFIX)(qf, q + (b * H + h * G) * D, scale, k_pool, v_pool, slots, L, G, D,
                                                 h, N, scores, acc, lse);
            else
#endif
                CAT(decode_task_portable_, SUFFIX)(qf, k_pool, v_pool, slots, L, G, D, h, N, scores, acc, lse);
            for (int64_t g = 0; g < G; g++) {
                const int64_t row = b * H + h * G + g;
                if (prior_o) {
                    for (int64_t d = 0; d < D; d++) pf[d] = TO_F32(prior_o[row * D + d]);
                    merge_prior(acc + g * D, D, lse[g], pf, prior_lse[row]);
                }
                for (int64_t d = 0; d < D; d++) out[row * D + d] = FROM_F32(acc[g * D + d]);
            }
        }
        free(scores);
    }
    return err;
}
#undef CAT
#undef CAT_
