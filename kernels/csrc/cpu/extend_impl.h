/*
 * The portable extend attention body, instantiated once per element type by extend_portable.c
 * (define ELEM, SUFFIX, TO_F32, FROM_F32, then include). Float32 math in loops the compiler
 * vectorises for the target (AVX-512F, AVX2, NEON); exp through common.h's softmax_numerators.
 *
 * Same contract as extend_causal_bf16 (extend_attention.c: segments, pool keys from k_begin, new keys
 * causal, the sliding window, k == NULL for pool keys only, q_index, lse_out, prior merge). Any D <= 256 and
 * H % Hkv == 0 (else -1); -2 when memory runs out. Every row must see at least one key.
 *
 * Two phases like the bf16 kernel. Pack, tasks (segment, KV head, KC keys): keys converted once to
 * float32, K transposed [D][n32], V row-major [n32][D] (n32: keys rounded up to 32, zero pads). Attend,
 * tasks (segment, KV head, block of QB queries): rows in cache blocks of BM, PRB at a time in registers;
 * scores in blocks of 16 SKV keys and P.V in blocks of 16 PVC dims, so the sums stay in registers (the axpy
 * form stored every partial sum: store-bound) and each K / V vector loaded feeds PRB rows; keys in chunks
 * of KCH that stay in L1 while every row of the cache block reads them (K's [D][n32] rows are n32 floats
 * apart: a 4-row block alone re-streamed all of K from L2). The last Lmax % 32 keys of a block run as
 * a whole 32-key vector block over zero pads: as strided scalar dots they took most of a causal call's
 * time. AVX-512 takes the GEMM micro-kernel's shape, 6 rows x 4 vectors (64 keys / all 64 dims) in both
 * loops: one broadcast per 4 FMAs instead of per 2 (the broadcasts share the FMA's issue slots).
 * BM 36 / 96 and KCH 64 / 256 beside BM 48 / KCH 128: noise; the softmax's 1 / sum folded into the
 * output instead of the numerators: no gain. Each step's figures: docs/PERFORMANCE.md#attention-kernels.
 */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#ifdef __AVX512F__ /* 32 vector registers: 6 rows x 4 vectors of sums (+ the loads) */
#define PRB 6  /* rows per register block */
#define SKV 4  /* 16-key vectors per score block */
#define PVC 4  /* 16-lane vectors per P.V column block */
#define BM 48  /* rows per cache block: each chunk of K / V is read from L1 by all of them */
#else /* 16 (AVX2: 8 vf16 of two registers each) */
#define PRB 4
#define SKV 2
#define PVC 4
#define BM 32
#endif
#define KCH 128 /* keys per chunk (K and V chunks of 32 KB each at D = 64) */
#ifndef RADIXLANG_VF16
#define RADIXLANG_VF16
/* 16 floats as one GCC vector: one zmm with AVX-512, two ymm with AVX2, four NEON registers */
typedef float vf16 __attribute__((vector_size(64)));
/* 16 floats from p (unaligned) */
static inline vf16 loadu_vf16(const float *p) {
    vf16 v;
    memcpy(&v, p, sizeof v);
    return v;
}
#endif
/* the token row of segment r's query j (q_index maps the segment's rows to rows of q) */
#define Q_TOKEN(r, j) (q_index ? q_index[starts[r] + (j)] : starts[r] + (j))
#define SEG_SLOTS(r) (npool[r] ? req_to_token + req_rows[r] * rt_stride + (k_begin ? k_begin[r] : 0) : NULL)

/* Keys c0 .. c1 - 1 (c0 % 16 == 0; keys >= n are zero) of one segment and KV head as float32 (the first np
 * from the pool at slot[l], the rest rows s + l - np of k / v): K transposed into kt [D][n32] (16 keys at a
 * time, so each line of kt is written whole), V row-major into vf [n32][D]. */
static void CAT(pack_keys_, SUFFIX)(const ELEM *k_pool, const ELEM *v_pool, int64_t N, const int64_t *slot, int64_t np,
                                    int64_t n, int64_t n32, const ELEM *k, int64_t k_stride, const ELEM *v,
                                    int64_t v_stride, int64_t s, int64_t h, int64_t D, int64_t c0, int64_t c1,
                                    float *kt, float *vf) {
    static const ELEM zero_row[256]; /* the pads past the segment's n keys */
    for (int64_t l0 = c0; l0 < c1; l0 += 16) {
        const ELEM *kr[16];
        for (int i = 0; i < 16; i++) {
            const int64_t l = l0 + i;
            kr[i] = l >= n ? zero_row : l < np ? k_pool + (h * N + slot[l]) * D : k + (s + l - np) * k_stride + h * D;
            const ELEM *vr = l >= n ? zero_row : l < np ? v_pool + (h * N + slot[l]) * D : v + (s + l - np) * v_stride + h * D;
            for (int64_t d = 0; d < D; d++) vf[l * D + d] = TO_F32(vr[d]);
        }
        for (int64_t d = 0; d < D; d++)
            for (int i = 0; i < 16; i++) kt[d * n32 + l0 + i] = TO_F32(kr[i][d]);
    }
}

/* Scores of PRB rows (qs: scaled float32 queries) against keys l0 .. l0 + 16 nv - 1 of kt [D][n], into ss
 * rows of width ld: PRB x nv sums in registers across d, each K vector loaded feeding PRB rows (nv a
 * constant: SKV for the body, 2 for a last block of 32 keys). */
static inline __attribute__((always_inline)) void CAT(score_block_, SUFFIX)(float (*qs)[256], const float *kt,
                                                                           int64_t n, int64_t D, int64_t l0,
                                                                           float *ss, int64_t ld, const int nv) {
    vf16 a[PRB][SKV];
    for (int i = 0; i < PRB; i++)
        for (int c = 0; c < nv; c++) a[i][c] = (vf16){0};
    for (int64_t d = 0; d < D; d++) {
        vf16 kv[SKV];
        for (int c = 0; c < nv; c++) kv[c] = loadu_vf16(kt + d * n + l0 + 16 * c);
        for (int i = 0; i < PRB; i++)
            for (int c = 0; c < nv; c++) a[i][c] += qs[i][d] * kv[c];
    }
    for (int i = 0; i < PRB; i++)
        for (int c = 0; c < nv; c++) memcpy(ss + i * ld + l0 + 16 * c, &a[i][c], sizeof a[i][c]);
}

int CAT(extend_causal_, SUFFIX)(const ELEM *q, int64_t q_stride, const ELEM *k, int64_t k_stride, const ELEM *v,
                                int64_t v_stride, const int64_t *starts, const int64_t *lens, int64_t R, int64_t H,
                                int64_t Hkv, int64_t D, float scale, ELEM *out, const ELEM *k_pool,
                                const ELEM *v_pool, int64_t N, const int64_t *req_to_token, int64_t rt_stride,
                                const int64_t *req_rows, const int64_t *prefix_lens, const int64_t *k_begin,
                                const int64_t *q_index, float *lse_out, const ELEM *prior_o, const float *prior_lse,
                                int64_t window) {
    if (D > 256 || H % Hkv != 0) return -1;
    const int64_t G = H / Hkv, KC = 256;
    /* segments and tasks (common.h); per KV head a block of 2 D floats per key: K [D][n32], V [n32][D] */
    extend_plan pl;
    int err = extend_plan_make(&pl, lens, R, Hkv, prefix_lens, k_begin, k != NULL, 32, 2 * D, 64, KC);
    float *packed = err ? NULL : (float *)malloc(sizeof(float) * (size_t)(pl.pk_off[R] > 0 ? pl.pk_off[R] : 1));
    if (!packed) {
        err = -2;
        goto done;
    }
    const int64_t *npool = pl.npool, *nkeys = pl.nkeys, *n32s = pl.nal, *ahead = pl.ahead, *pk_off = pl.pk_off;
    const int64_t *pack_task = pl.pack_task, *task_off = pl.task_off, QB = pl.qb, max_n = pl.max_al, own_n = pl.own_al;
#pragma omp parallel
    {
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < pack_task[R]; task++) {
            const int64_t r = extend_task_request(pack_task, R, task);
            const int64_t local = task - pack_task[r], h = local % Hkv, c0 = local / Hkv * KC;
            float *kt = packed + pk_off[r] + h * 2 * D * n32s[r];
            CAT(pack_keys_, SUFFIX)(k_pool, v_pool, N, SEG_SLOTS(r), npool[r], nkeys[r], n32s[r], k, k_stride, v,
                                    v_stride, starts[r], h, D, c0, c0 + KC < n32s[r] ? c0 + KC : n32s[r], kt,
                                    kt + D * n32s[r]);
        }
        /* the implicit barrier: every block is packed before any is read */
        float *sc = (float *)malloc(sizeof(float) * (size_t)(BM * max_n));
        float *own = (float *)malloc(sizeof(float) * (size_t)(2 * D * own_n));
        float acc[BM][256], qf[BM][256], pf[256]; /* 2 BM KB of stack: libgomp threads have MBs */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < task_off[R]; task++) {
            if (!sc || !own) {
                err = -2;
                continue;
            }
            const int64_t r = extend_task_request(task_off, R, task);
            const int64_t local = task - task_off[r], h = local % Hkv, j0 = local / Hkv * QB;
            const int64_t j1 = j0 + QB < lens[r] ? j0 + QB : lens[r], n = n32s[r], np = npool[r];
            const float *kt = packed + pk_off[r] + h * 2 * D * n, *vf = kt + D * n;
            if (!ahead[r]) { /* one block reads this segment: pack it here, while it stays in cache */
                CAT(pack_keys_, SUFFIX)(k_pool, v_pool, N, SEG_SLOTS(r), np, nkeys[r], n, k, k_stride, v, v_stride,
                                        starts[r], h, D, 0, n, own, own + D * n);
                kt = own, vf = own + D * n;
            }
            const int64_t nrows = (j1 - j0) * G;
            for (int64_t b0 = 0; b0 < nrows; b0 += BM) {
                /* rows b0 .. b0 + nb - 1, padded to whole sub-blocks of PRB with repeats of the last row
                 * (computed, never stored) */
                const int64_t nb = nrows - b0 < BM ? nrows - b0 : BM, nsub = (nb + PRB - 1) / PRB;
                int64_t t[BM], hh[BM], L[BM], F[BM], Lmax = 0;
                for (int64_t i = 0; i < nsub * PRB; i++) {
                    const int64_t row = b0 + (i < nb ? i : nb - 1), j = j0 + row / G;
                    t[i] = Q_TOKEN(r, j);
                    hh[i] = h * G + row % G;
                    L[i] = np + (k ? j + 1 : 0);
                    F[i] = window_first_key(window, prefix_lens, k_begin, k != NULL, r, j);
                    Lmax = L[i] > Lmax ? L[i] : Lmax;
                    const ELEM *qr = q + t[i] * q_stride + hh[i] * D;
                    for (int64_t d = 0; d < D; d++) qf[i][d] = TO_F32(qr[d]) * scale;
                }
                /* the next cache block's query rows into L2 while this block computes: their first read
                 * missed the caches (q straight from the qkv GEMM), a visible share of a causal call's
                 * samples (docs/PERFORMANCE.md#attention-kernels) */
                for (int64_t row = b0 + BM; row < b0 + 2 * BM && row < nrows; row++) {
                    const char *qr = (const char *)(q + Q_TOKEN(r, j0 + row / G) * q_stride + (h * G + row % G) * D);
                    for (int64_t c = 0; c < D * (int64_t)sizeof(ELEM); c += 64) __builtin_prefetch(qr + c, 0, 2);
                }
                /* scores chunk by chunk of KCH keys (the chunk of K stays in L1 while every sub-block reads
                 * it), 32 keys x PRB rows at a time (2 * PRB independent sums stay in registers across d), up
                 * to Lmax rounded up to 32: keys past a row's L[i] (later keys, or zero pads, which kt has up to
                 * n32) are computed and ignored, so every score is the same sum over d in order, whatever
                 * block it falls in. */
                const int64_t L32 = (Lmax + 31) / 32 * 32;
                for (int64_t c0 = 0; c0 < L32; c0 += KCH) {
                    const int64_t c1 = c0 + KCH < L32 ? c0 + KCH : L32;
                    for (int64_t sb = 0; sb < nsub; sb++) {
                        float(*qs)[256] = qf + sb * PRB;
                        float *ss = sc + sb * PRB * max_n;
                        int64_t l0 = c0;
                        for (; l0 + 16 * SKV <= c1; l0 += 16 * SKV)
                            CAT(score_block_, SUFFIX)(qs, kt, n, D, l0, ss, max_n, SKV);
                        for (; l0 < c1; l0 += 32) CAT(score_block_, SUFFIX)(qs, kt, n, D, l0, ss, max_n, 2);
                    }
                }
                float lse[BM];
                for (int64_t i = 0; i < nsub * PRB; i++) {
                    float m, *si = sc + i * max_n;
                    window_mask(si, F[i]);
                    const float sum = softmax_numerators(si, L[i], &m);
                    window_zero(si, F[i]);
                    lse[i] = m + logf(sum);
                    const float inv = 1.f / sum;
                    for (int64_t l = 0; l < L[i]; l++) si[l] *= inv;
                    for (int64_t l = L[i]; l < Lmax; l++) si[l] = 0.f;
                }
                /* P.V, 16 PVC dims x PRB rows at a time (PVC * PRB independent sums in registers), chunk by chunk
                 * of KCH keys (the chunk of V stays in L1), the sums kept in acc between chunks: per
                 * element one sum over the keys in order, as without chunks; dims past the whole 16 PVC-dim
                 * blocks lane by lane */
                int64_t d0 = 0;
                for (; d0 + 16 * PVC <= D; d0 += 16 * PVC)
                    for (int64_t c0 = 0; c0 < Lmax; c0 += KCH) {
                        const int64_t c1 = c0 + KCH < Lmax ? c0 + KCH : Lmax;
                        for (int64_t sb = 0; sb < nsub; sb++) {
                            vf16 a[PRB][PVC];
                            for (int i = 0; i < PRB; i++)
                                for (int c = 0; c < PVC; c++)
                                    if (c0)
                                        a[i][c] = loadu_vf16(acc[sb * PRB + i] + d0 + 16 * c);
                                    else
                                        a[i][c] = (vf16){0};
                            const float *ps = sc + sb * PRB * max_n;
                            for (int64_t l = c0; l < c1; l++) {
                                vf16 vv[PVC];
                                for (int c = 0; c < PVC; c++) vv[c] = loadu_vf16(vf + l * D + d0 + 16 * c);
                                for (int i = 0; i < PRB; i++) {
                                    const float p = ps[i * max_n + l];
                                    for (int c = 0; c < PVC; c++) a[i][c] += p * vv[c];
                                }
                            }
                            for (int i = 0; i < PRB; i++)
                                for (int c = 0; c < PVC; c++) memcpy(acc[sb * PRB + i] + d0 + 16 * c, &a[i][c], sizeof a[i][c]);
                        }
                    }
                for (int64_t i = 0; i < nsub * PRB; i++) {
                    for (int64_t d = d0; d < D; d++) acc[i][d] = 0.f;
                    for (int64_t l = 0; l < Lmax; l++) {
                        const float p = sc[i * max_n + l];
                        for (int64_t d = d0; d < D; d++) acc[i][d] += p * vf[l * D + d];
                    }
                }
                for (int64_t i = 0; i < nb; i++) {
                    const int64_t row = t[i] * H + hh[i];
                    if (prior_o) {
                        for (int64_t d = 0; d < D; d++) pf[d] = TO_F32(prior_o[row * D + d]);
                        merge_prior(acc[i], D, lse[i], pf, prior_lse[row]);
                    }
                    if (lse_out) lse_out[row] = lse[i];
                    ELEM *o = out + row * D;
                    for (int64_t d = 0; d < D; d++) o[d] = FROM_F32(acc[i][d]);
                }
            }
        }
        free(sc), free(own);
    }
done:
    free(packed);
    extend_plan_free(&pl);
    return err;
}
#undef PRB
#undef PVC
#undef SKV
#undef BM
#undef KCH
#undef SEG_SLOTS
#undef Q_TOKEN
#undef CAT
#undef CAT_
