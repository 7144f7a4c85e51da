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
#ifndef RADIXLANG_DECODE_PREFETCH
#define RADIXLANG_DECODE_PREFETCH
/* Rows i0 .. i1 - 1 (clipped to L) of one KV head's positions into L2: the `lines` cache lines of each
 * pool row at slot slots[i] (pool [Hkv, N, D] of `row_bytes`-byte rows, base `pool`, head h). */
/* always_inline: as a call in the P.V loop it was far slower on scattered slots */
static inline __attribute__((always_inline)) void prefetch_rows(const void *pool, const int64_t *slots, int64_t i0,
                                                                int64_t i1, int64_t L, int64_t h, int64_t N,
                                                                int64_t row_bytes, int64_t lines) {
    for (int64_t i = i0; i < i1 && i < L; i++)
        for (int64_t c = 0; c < lines; c++)
            _mm_prefetch((const char *)pool + (h * N + slots[i]) * row_bytes + 64 * c, _MM_HINT_T1);
}
#endif

/* out[g] = inv_sum[g] * sum_l p[g * L + l] * v_l for g < gb, V rows of D = 16 J elements: per element
 * one FMA chain over l in order (every block shape gives the same sums). Written once; instantiated
 * with constant J, gb (always_inline at the PV_BLOCK cases) so the gb x J accumulators are registers. */
static inline __attribute__((always_inline)) void CAT(pv_body_, SUFFIX)(
    const float *p, int64_t L, const ELEM *v_pool, const int64_t *slots, int64_t h, int64_t N, int64_t J,
    int64_t gb, int64_t lines, const float *inv_sum, float *out) {
    const int64_t D = 16 * J;
    __m512 av[16 * 16];
    for (int64_t i = 0; i < gb * J; i++) av[i] = _mm512_setzero_ps();
    const int64_t row_bytes = D * (int64_t)sizeof(ELEM);
    prefetch_rows(v_pool, slots, 0, 32, L, h, N, row_bytes, lines);
    for (int64_t l = 0; l < L; l++) {
        const ELEM *vr = v_pool + (h * N + slots[l]) * D;
        prefetch_rows(v_pool, slots, l + 32, l + 33, L, h, N, row_bytes, lines);
        __m512 vv[16];
        for (int64_t j = 0; j < J; j++) vv[j] = LOAD16(vr + 16 * j);
        for (int64_t g = 0; g < gb; g++) {
            const __m512 pg = _mm512_set1_ps(p[g * L + l]);
            for (int64_t j = 0; j < J; j++) av[g * J + j] = _mm512_fmadd_ps(pg, vv[j], av[g * J + j]);
        }
    }
    for (int64_t g = 0; g < gb; g++)
        for (int64_t j = 0; j < J; j++)
            _mm512_storeu_ps(out + g * D + 16 * j, _mm512_mul_ps(av[g * J + j], _mm512_set1_ps(inv_sum[g])));
}
static __attribute__((noinline)) void CAT(pv_block_generic_, SUFFIX)(
    const float *p, int64_t L, const ELEM *v_pool, const int64_t *slots, int64_t h, int64_t N, int64_t J,
    int64_t gb, int64_t lines, const float *inv_sum, float *out) {
    CAT(pv_body_, SUFFIX)(p, L, v_pool, slots, h, N, J, gb, lines, inv_sum, out);
}

/* The vector path: D % 16 == 0. Scores go 16 positions at a time: one accumulator per position (a
 * VDPBF16PS or FMA chain over the row), the 16 reduced together by hsum16x16; a K/V row is loaded once
 * per query head from L1. Rows 64 (K) / 32 (V) positions ahead are prefetched into L2: slots need not
 * be consecutive (a request's pages lie anywhere in the pool). With it shuffled slots run as fast as
 * consecutive ones; prefetching nearer (into L1) or not from the task's start was slower
 * (docs/PERFORMANCE.md#attention-kernels). */
static void CAT(decode_task_avx512_, SUFFIX)(const float *qf, const ELEM *qb, float scale, const ELEM *k_pool,
                                            const ELEM *v_pool, const int64_t *slots, int64_t L, int64_t G,
                                            int64_t D, int64_t h, int64_t N, float *scores, float *acc, float *lse) {
    static const ELEM zero_row[256]; /* the rows past L of the last block: their lanes are not stored */
    const int64_t J = D / 16, lines = (D * (int64_t)sizeof(ELEM) + 63) / 64;
    (void)qb, (void)scale;
#if ELEM_IS_BF16 && defined(__AVX512BF16__)
    /* bf16 dot products straight from the pool (VDPBF16PS: exact products, float32 sums); qb holds the
     * G unscaled bf16 query rows, the scale is applied to the sums. */
    const int dp = D % 32 == 0;
    const int64_t P = D / 32;
    __m512bh qv[32 * 8];
    if (dp)
        for (int64_t g = 0; g < G; g++)
            for (int64_t p = 0; p < P; p++) qv[g * P + p] = (__m512bh)_mm512_loadu_si512(qb + g * D + 32 * p);
#endif
    prefetch_rows(k_pool, slots, 0, 64, L, h, N, D * (int64_t)sizeof(ELEM), lines);
    for (int64_t l0 = 0; l0 < L; l0 += 16) {
        const int64_t n = L - l0 < 16 ? L - l0 : 16;
        const ELEM *kr[16];
        for (int64_t i = 0; i < 16; i++) kr[i] = i < n ? k_pool + (h * N + slots[l0 + i]) * D : zero_row;
        prefetch_rows(k_pool, slots, l0 + 64, l0 + 80, L, h, N, D * (int64_t)sizeof(ELEM), lines);
        for (int64_t g = 0; g < G; g++) {
            __m512 a[16];
#pragma GCC unroll 16
            for (int64_t i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
#if ELEM_IS_BF16 && defined(__AVX512BF16__)
            if (dp) {
                for (int64_t p = 0; p < P; p++) {
                    const __m512bh qp = qv[g * P + p];
#pragma GCC unroll 16
                    for (int64_t i = 0; i < 16; i++)
                        a[i] = _mm512_dpbf16_ps(a[i], qp, (__m512bh)_mm512_loadu_si512(kr[i] + 32 * p));
                }
            } else
#endif
            for (int64_t j = 0; j < J; j++) {
                const __m512 qj = _mm512_loadu_ps(qf + g * D + 16 * j);
#pragma GCC unroll 16
                for (int64_t i = 0; i < 16; i++) a[i] = _mm512_fmadd_ps(qj, LOAD16(kr[i] + 16 * j), a[i]);
            }
            __m512 sv = hsum16x16(a);
#if ELEM_IS_BF16 && defined(__AVX512BF16__)
            if (dp) sv = _mm512_mul_ps(sv, _mm512_set1_ps(scale));
#endif
            _mm512_mask_storeu_ps(scores + g * L + l0, (__mmask16)((1u << n) - 1u), sv);
        }
    }
    float inv_sum[32];
    for (int64_t g = 0; g < G; g++) {
        float m;
        const float sum = softmax_numerators(scores + g * L, L, &m);
        inv_sum[g] = 1.f / sum;
        lse[g] = m + logf(sum);
    }
    /* acc_g = sum_l p_gl v_l: blocks of query heads whose G' x J accumulators stay in registers */
    const int64_t GB = J <= 16 ? 16 / J : 1;
    for (int64_t g0 = 0; g0 < G; g0 += GB) {
        const int64_t gb = G - g0 < GB ? G - g0 : GB;
        const float *p = scores + g0 * L;
        float *o = acc + g0 * D;
        const float *is = inv_sum + g0;
#define PV_BLOCK(j, g) \
    case j * 100 + g: CAT(pv_body_, SUFFIX)(p, L, v_pool, slots, h, N, j, g, lines, is, o); break;
        switch (J * 100 + gb) { /* the common head dims (32, 64, 128) with constant J, gb; the rest generic */
            PV_BLOCK(2, 1) PV_BLOCK(2, 2) PV_BLOCK(2, 3) PV_BLOCK(2, 4) PV_BLOCK(2, 5) PV_BLOCK(2, 6) PV_BLOCK(2, 7)
            PV_BLOCK(2, 8) PV_BLOCK(4, 1) PV_BLOCK(4, 2) PV_BLOCK(4, 3) PV_BLOCK(4, 4) PV_BLOCK(8, 1) PV_BLOCK(8, 2)
        default: CAT(pv_block_generic_, SUFFIX)(p, L, v_pool, slots, h, N, J, gb, lines, is, o);
        }
#undef PV_BLOCK
    }
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
