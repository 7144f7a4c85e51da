/*
 * Extend attention, bfloat16, CPU, AVX-512 BF16: each segment's query rows attend to a range of
 * positions read in place from the paged pool and, causally, to the segment's new tokens, in one softmax.
 *
 * Segments (the contract of every extend kernel: extend_impl.h is the portable body):
 *   segment r has lens[r] query rows; row j is token row t = q_index ? q_index[starts[r] + j] : starts[r] + j
 *   of q [T, *] (H heads of D at q + t * q_stride, element strides) and of out [T, H, D] (contiguous).
 *   Pool keys (prefix_lens != NULL): positions k_begin[r] (NULL: 0) .. prefix_lens[r] - 1 of table row
 *   req_rows[r], at slots req_to_token[req_rows[r] * rt_stride + pos] of k_pool / v_pool [Hkv, N, D].
 *   New keys (k != NULL): rows starts[r] .. starts[r] + lens[r] - 1 of k / v (Hkv heads at k + t * k_stride);
 *   row j sees new keys 0 .. j. With k == NULL a row sees only the pool keys (cascade's shared part).
 *   lse_out [T, H] float32 (NULL: not written): log-sum-exp of each row's scaled scores.
 *   prior_o [T, H, D] bf16 + prior_lse [T, H] (NULL: none): merged into each row (common.h merge_prior).
 *   window > 0: sliding-window attention, each row sees only the keys common.h window_first_key allows.
 * Query head h uses KV head h / (H / Hkv).
 *
 * Two phases in one parallel region. Pack, tasks (segment, KV head, 256 keys): K into d-pair-major
 * [D/2][n16] (bf16 pairs), so one VDPBF16PS gives 16 keys' partial dot products in its lanes; V into
 * key pairs [n16/2][D], so P.V is VDPBF16PS too. Each (segment, head) is packed once, whatever the
 * number of query blocks reading it (a shared prefix of 1,024 keys read by 2,000 rows: once).
 * Attend, tasks (segment, KV head, block of up to MAX_QB queries): rows (query, head of the group) four at a
 * time, so each packed K / V load feeds 4 rows (8 and 16 independent accumulators: the FMA chains
 * are not latency-bound). Per row: scores -> softmax numerators -> P.V, numerators rounded to bf16
 * (as GPU flash attention rounds P), float32 sums, bf16 output.
 * Returns -1 when unsupported (D % 32 != 0, D > 256, or no AVX-512 BF16): the caller falls back; -2 out of memory.
 */
#include <stdlib.h>

#include "common.h"
#include "kernels.h"

#define MAX_QB 128 /* query rows per attend task (fewer when there are few: extend_query_block) */
#define KC 256  /* keys per pack task */
#define RB 4    /* rows per register block */
#define BM 32   /* rows per cache block: each chunk of K / V is read from L1 by all of them */
#define KCH 128 /* keys per chunk (K and V chunks of 16 KB each at D = 64) */

#if defined(__AVX512F__) && defined(__AVX512BF16__)
/* r[c] = column c of the 16 x 16 matrix of 32-bit words whose rows were r[0..16): unpacks of 32- and
 * 64-bit elements, then two rounds of 128-bit lane shuffles (64 instructions for 256 words). */
static inline void transpose16x16_epi32(__m512i *r) {
    __m512i t[16], u[16], v[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* u[4i + j], 128-bit lane k: rows 4i .. 4i + 3 of column 4k + j */
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        v[j] = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88);
        v[4 + j] = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xdd);
        v[8 + j] = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
        v[12 + j] = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xdd);
    }
    for (int j = 0; j < 4; j++) { /* columns j, 8 + j, 4 + j, 12 + j */
        r[j] = _mm512_shuffle_i32x4(v[j], v[8 + j], 0x88);
        r[8 + j] = _mm512_shuffle_i32x4(v[j], v[8 + j], 0xdd);
        r[4 + j] = _mm512_shuffle_i32x4(v[4 + j], v[12 + j], 0x88);
        r[12 + j] = _mm512_shuffle_i32x4(v[4 + j], v[12 + j], 0xdd);
    }
}

/* Keys c0 .. c1 - 1 (c0, c1 even; keys >= n are zero) of one segment and KV head: the first np from the
 * pool at slot[l], the rest rows s + l - np of k / v. K into d-pair-major kt [D/2][n16], V into key
 * pairs vt [n16/2][D]: vt[lp][d] = (v[2lp+1][d] << 16) | v[2lp][d] (bf16 bits). */
static void pack_keys_bf16(const uint16_t *k_pool, const uint16_t *v_pool, int64_t N, const int64_t *slot, int64_t np,
                           int64_t n, int64_t n16, const uint16_t *k, int64_t k_stride, const uint16_t *v,
                           int64_t v_stride, int64_t s, int64_t h, int64_t D, int64_t c0, int64_t c1, uint32_t *kt,
                           uint32_t *vt) {
    const int64_t P = D / 2;
#define KROW(l) ((l) < np ? k_pool + (h * N + slot[l]) * D : k + (s + (l) - np) * k_stride + h * D)
#define VROW(l) ((l) < np ? v_pool + (h * N + slot[l]) * D : v + (s + (l) - np) * v_stride + h * D)
    int64_t l = c0;
    for (; l + 16 <= c1 && l + 16 <= n; l += 16) { /* whole blocks of 16 keys: 16 x 16 transposes */
        const uint32_t *rows[16];
        for (int i = 0; i < 16; i++) rows[i] = (const uint32_t *)KROW(l + i);
        for (int64_t p0 = 0; p0 < P; p0 += 16) { /* P = D / 2, a multiple of 16 */
            __m512i r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(rows[i] + p0);
            transpose16x16_epi32(r);
            for (int c = 0; c < 16; c++) _mm512_storeu_si512(kt + (p0 + c) * n16 + l, r[c]);
        }
    }
    for (; l < c1; l++) {
        if (l < n) {
            const uint32_t *kr = (const uint32_t *)KROW(l);
            for (int64_t pp = 0; pp < P; pp++) kt[pp * n16 + l] = kr[pp];
        } else {
            for (int64_t pp = 0; pp < P; pp++) kt[pp * n16 + l] = 0u;
        }
    }
    for (int64_t lp = c0 / 2; lp < c1 / 2; lp++) {
        const uint16_t *v0 = 2 * lp < n ? VROW(2 * lp) : NULL, *v1 = 2 * lp + 1 < n ? VROW(2 * lp + 1) : NULL;
        if (v0 && v1) { /* 16 pairs per vector: v0's element in the low half, v1's in the high */
            for (int64_t d = 0; d < D; d += 16) {
                const __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(v0 + d)));
                const __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(v1 + d)));
                _mm512_storeu_si512(vt + lp * D + d, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
            }
            continue;
        }
        for (int64_t d = 0; d < D; d++) vt[lp * D + d] = (v1 ? (uint32_t)v1[d] << 16 : 0u) | (v0 ? v0[d] : 0u);
    }
#undef KROW
#undef VROW
}

/* Scores of RB rows (q pair pointers qp[0..RB)) for keys [c0, c1) (c0 % 32 == 0) into sc rows of width
 * ld: 32 keys per pass (two 16-key blocks, the second when in range): 8 independent accumulators. */
static inline __attribute__((always_inline)) void scores_block(const uint32_t **qp, const uint32_t *kt, int64_t n16,
                                                              int64_t P, int64_t c0, int64_t c1, float scale,
                                                              float *sc, int64_t ld) {
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t l0 = c0; l0 < c1; l0 += 32) {
        __m512 a[RB], b[RB];
        for (int i = 0; i < RB; i++) a[i] = b[i] = _mm512_setzero_ps();
        if (l0 + 16 < c1) {
            for (int64_t pp = 0; pp < P; pp++) {
                const __m512bh k0v = (__m512bh)_mm512_load_si512(kt + pp * n16 + l0);
                const __m512bh k1v = (__m512bh)_mm512_load_si512(kt + pp * n16 + l0 + 16);
                for (int i = 0; i < RB; i++) {
                    const __m512bh qb = (__m512bh)_mm512_set1_epi32((int)qp[i][pp]);
                    a[i] = _mm512_dpbf16_ps(a[i], qb, k0v);
                    b[i] = _mm512_dpbf16_ps(b[i], qb, k1v);
                }
            }
            for (int i = 0; i < RB; i++) {
                _mm512_store_ps(sc + i * ld + l0, _mm512_mul_ps(a[i], vs));
                _mm512_store_ps(sc + i * ld + l0 + 16, _mm512_mul_ps(b[i], vs));
            }
        } else {
            for (int64_t pp = 0; pp < P; pp++) {
                const __m512bh k0v = (__m512bh)_mm512_load_si512(kt + pp * n16 + l0);
                for (int i = 0; i < RB; i++) a[i] = _mm512_dpbf16_ps(a[i], (__m512bh)_mm512_set1_epi32((int)qp[i][pp]), k0v);
            }
            for (int i = 0; i < RB; i++) _mm512_store_ps(sc + i * ld + l0, _mm512_mul_ps(a[i], vs));
        }
    }
}

/* P.V of RB rows over key pairs [lp0, lp1), JC 16-lane column groups from group jc, added to ob [RB][D]
 * (set, not added, when lp0 == 0). pr[i]: row i's numerators as bf16 pairs. 4 x JC accumulators. */
static inline __attribute__((always_inline)) void pv_block(const uint32_t **pr, const uint32_t *vt, int64_t D,
                                                          int64_t lp0, int64_t lp1, int64_t jc, int JC, float *ob) {
    __m512 acc[RB][4];
    for (int r = 0; r < RB; r++)
        for (int j = 0; j < JC; j++)
            acc[r][j] = lp0 ? _mm512_loadu_ps(ob + r * D + 16 * (jc + j)) : _mm512_setzero_ps();
    for (int64_t lp = lp0; lp < lp1; lp++) {
        __m512bh vv[4];
        for (int j = 0; j < JC; j++) vv[j] = (__m512bh)_mm512_load_si512(vt + lp * D + 16 * (jc + j));
        for (int r = 0; r < RB; r++) {
            const __m512bh p = (__m512bh)_mm512_set1_epi32((int)pr[r][lp]);
            for (int j = 0; j < JC; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], p, vv[j]);
        }
    }
    for (int r = 0; r < RB; r++)
        for (int j = 0; j < JC; j++) _mm512_storeu_ps(ob + r * D + 16 * (jc + j), acc[r][j]);
}
#endif

int extend_causal_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *k, int64_t k_stride, const uint16_t *v,
                       int64_t v_stride, const int64_t *starts, const int64_t *lens, int64_t R, int64_t H, int64_t Hkv,
                       int64_t D, float scale, uint16_t *out, const uint16_t *k_pool, const uint16_t *v_pool, int64_t N,
                       const int64_t *req_to_token, int64_t rt_stride, const int64_t *req_rows,
                       const int64_t *prefix_lens, const int64_t *k_begin, const int64_t *q_index, float *lse_out,
                       const uint16_t *prior_o, const float *prior_lse, int64_t window) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    if (D % 32 != 0 || D > 256 || H % Hkv != 0) return -1;
    const int64_t G = H / Hkv, P = D / 2, J = D / 16;
    /* segments and tasks (common.h); per KV head a block of D uint32 words per key: K [P][n16], V [n16/2][D] */
    extend_plan pl;
    int err = extend_plan_make(&pl, lens, R, Hkv, prefix_lens, k_begin, k != NULL, 16, D, MAX_QB, KC);
    uint32_t *packed = err ? NULL : (uint32_t *)aligned_alloc(64, sizeof(uint32_t) * (size_t)(pl.pk_off[R] > 0 ? pl.pk_off[R] : 16));
    if (!packed) {
        err = -2;
        goto done;
    }
    const int64_t *npool = pl.npool, *nkeys = pl.nkeys, *n16s = pl.nal, *ahead = pl.ahead, *pk_off = pl.pk_off;
    const int64_t *pack_task = pl.pack_task, *task_off = pl.task_off, QB = pl.qb, max16 = pl.max_al, own16 = pl.own_al;
    /* keys c0 .. c1 - 1 of segment r, KV head h, into kt [P][n16] and vt [n16/2][D] (c0, c1 even) */
#define np_slots(r) (npool[r] ? req_to_token + req_rows[r] * rt_stride + (k_begin ? k_begin[r] : 0) : NULL)
#define pack_keys(r, h, c0, c1, kt, vt) \
    pack_keys_bf16(k_pool, v_pool, N, np_slots(r), npool[r], nkeys[r], n16s[r], k, k_stride, v, v_stride, \
                   starts[r], h, D, c0, c1, kt, vt)
#pragma omp parallel
    {
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < pack_task[R]; task++) {
            const int64_t r = extend_task_request(pack_task, R, task);
            const int64_t local = task - pack_task[r], h = local % Hkv, c0 = local / Hkv * KC;
            uint32_t *kt = packed + pk_off[r] + h * D * n16s[r];
            pack_keys(r, h, c0, c0 + KC < n16s[r] ? c0 + KC : n16s[r], kt, kt + P * n16s[r]);
        }
        /* the implicit barrier: every block is packed before any is read */
        float *sc = (float *)aligned_alloc(64, sizeof(float) * (size_t)(BM * max16));
        uint16_t *pb = (uint16_t *)aligned_alloc(64, sizeof(uint16_t) * (size_t)(BM * max16));
        uint32_t *own = (uint32_t *)aligned_alloc(64, sizeof(uint32_t) * (size_t)(D * own16));
        float ob[BM * 256], pf[256];
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < task_off[R]; task++) {
            if (!sc || !pb || !own) {
                err = -2;
                continue;
            }
            const int64_t r = extend_task_request(task_off, R, task);
            const int64_t local = task - task_off[r], h = local % Hkv, j0 = local / Hkv * QB;
            const int64_t j1 = j0 + QB < lens[r] ? j0 + QB : lens[r], n16 = n16s[r], np = npool[r];
            const uint32_t *kt = packed + pk_off[r] + h * D * n16, *vt = kt + P * n16;
            if (!ahead[r]) { /* one block reads this segment: pack it here, while it stays in cache */
                pack_keys(r, h, 0, n16, own, own + P * n16);
                kt = own, vt = own + P * n16;
            }
            const int64_t nrows = (j1 - j0) * G;
            for (int64_t b0 = 0; b0 < nrows; b0 += BM) {
                /* rows b0 .. b0 + nb - 1 (query j0 + row / G, head h * G + row % G), padded to whole
                 * sub-blocks of RB with repeats of the last row (computed, never stored) */
                const int64_t nb = nrows - b0 < BM ? nrows - b0 : BM, nsub = (nb + RB - 1) / RB;
                int64_t t[BM], hh[BM], L[BM], F[BM], Lmax = 0;
                const uint32_t *qp[BM], *pr[BM];
                for (int64_t i = 0; i < nsub * RB; i++) {
                    const int64_t row = b0 + (i < nb ? i : nb - 1), j = j0 + row / G;
                    t[i] = q_index ? q_index[starts[r] + j] : starts[r] + j;
                    hh[i] = h * G + row % G;
                    L[i] = np + (k ? j + 1 : 0);
                    F[i] = window_first_key(window, prefix_lens, k_begin, k != NULL, r, j);
                    Lmax = L[i] > Lmax ? L[i] : Lmax;
                    qp[i] = (const uint32_t *)(q + t[i] * q_stride + hh[i] * D);
                }
                /* scores chunk by chunk of KCH keys: the chunk of K stays in L1 while all nb rows read it */
                for (int64_t c0 = 0; c0 < Lmax; c0 += KCH)
                    for (int64_t sb = 0; sb < nsub; sb++)
                        scores_block(qp + sb * RB, kt, n16, P, c0, c0 + KCH < Lmax ? c0 + KCH : Lmax, scale,
                                     sc + sb * RB * max16, max16);
                /* softmax numerators per row over its own L, rounded to bf16; zero up to the pair boundary */
                const int64_t Lpair = (Lmax + 1) / 2 * 2;
                float lse[BM], inv[BM];
                for (int64_t i = 0; i < nsub * RB; i++) {
                    float *sr = sc + i * max16, m;
                    window_mask(sr, F[i]);
                    const float sum = softmax_numerators(sr, L[i], &m);
                    window_zero(sr, F[i]);
                    inv[i] = 1.f / sum;
                    lse[i] = m + logf(sum);
                    uint16_t *p = pb + i * max16;
                    int64_t l = 0;
                    for (; l + 16 <= L[i]; l += 16)
                        _mm256_store_si256((__m256i *)(p + l), (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(sr + l)));
                    if (l < L[i]) {
                        const __mmask16 tail = (__mmask16)((1u << (L[i] - l)) - 1u);
                        _mm256_mask_storeu_epi16(p + l, tail, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(tail, sr + l)));
                        l = L[i];
                    }
                    for (; l < Lpair; l++) p[l] = 0;
                    pr[i] = (const uint32_t *)p;
                }
                /* P.V chunk by chunk of KCH / 2 key pairs (the chunk of V stays in L1), sums kept in ob */
                for (int64_t lp0 = 0; lp0 < Lpair / 2; lp0 += KCH / 2) {
                    const int64_t lp1 = lp0 + KCH / 2 < Lpair / 2 ? lp0 + KCH / 2 : Lpair / 2;
                    for (int64_t sb = 0; sb < nsub; sb++) {
                        float *o = ob + sb * RB * D;
                        if (J % 4 == 0)
                            for (int64_t jc = 0; jc < J; jc += 4) pv_block(pr + sb * RB, vt, D, lp0, lp1, jc, 4, o);
                        else
                            for (int64_t jc = 0; jc < J; jc += 2) pv_block(pr + sb * RB, vt, D, lp0, lp1, jc, 2, o);
                    }
                }
                for (int64_t i = 0; i < nb; i++) {
                    float *o = ob + i * D;
                    for (int64_t d = 0; d < D; d++) o[d] *= inv[i];
                    const int64_t row = t[i] * H + hh[i];
                    if (prior_o) {
                        for (int64_t d = 0; d < D; d++) pf[d] = bf16_to_f32(prior_o[row * D + d]);
                        merge_prior(o, D, lse[i], pf, prior_lse[row]);
                    }
                    if (lse_out) lse_out[row] = lse[i];
                    for (int64_t j = 0; j < J; j++) store16_bf16(out + row * D + 16 * j, _mm512_loadu_ps(o + 16 * j));
                }
            }
        }
        free(sc), free(pb), free(own);
    }
done:
#undef pack_keys
#undef np_slots
    free(packed);
    extend_plan_free(&pl);
    return err;
#else
    (void)q, (void)q_stride, (void)k, (void)k_stride, (void)v, (void)v_stride, (void)starts, (void)lens, (void)R, (void)H;
    (void)Hkv, (void)D, (void)scale, (void)out, (void)k_pool, (void)v_pool, (void)N, (void)req_to_token, (void)rt_stride;
    (void)req_rows, (void)prefix_lens, (void)k_begin, (void)q_index, (void)lse_out, (void)prior_o, (void)prior_lse;
    (void)window;
    return -1;
#endif
}
