/* Shared helpers of the CPU kernels: bf16 <-> float32, a vector e^x (AVX-512 / AVX2) and the softmax
 * numerators every attention kernel uses. Each helper has a path for AVX-512F, AVX2+FMA and plain C;
 * which one compiles is decided by the target flags (cpu_caps.kernel_cflags), never -march=native. */
#ifndef RADIXLANG_CPU_COMMON_H
#define RADIXLANG_CPU_COMMON_H
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
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

/* IEEE fp16 (little-endian bytes at p, unaligned) -> float32 (GGUF block scales). */
static inline float half_to_f32(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    uint32_t u;
    if (exp == 0x1F) {
        u = sign | 0x7F800000u | (man << 13);  /* inf / nan */
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);  /* normal: rebias 15 -> 127 */
    } else if (man == 0) {
        u = sign;  /* zero */
    } else {  /* subnormal: man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
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

/* The 16 horizontal sums of v[0..16) as one vector: lane i = sum of v[i]'s lanes. A transposing tree
 * (4 levels: 8 + 4 + 2 + 1 pairs of two-source permutes and an add) where 16 separate reductions take
 * ~8 shuffle/add steps each. Level k holds 16 / 2^k partial sums per input, inputs in order; the sum
 * order of a lane is fixed (it depends on nothing but the lane). v is overwritten. */
static inline __m512 hsum16x16(__m512 *v) {
    /* level k (16, 8, 4, 2 partials per input): lo takes each input's first k / 2 partials, hi the rest;
     * indices 16.. name the second source */
    static const int32_t IDX[4][2][16] = {
        {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}, {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}},
        {{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}, {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31}},
        {{0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29}, {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31}},
        {{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}, {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}}};
#define HSUM_LEVEL(lvl, n)                                                                                  \
    do {                                                                                                   \
        const __m512i il = _mm512_loadu_si512(IDX[lvl][0]), ih = _mm512_loadu_si512(IDX[lvl][1]);          \
        _Pragma("GCC unroll 8") for (int j = 0; j < (n) / 2; j++) v[j] =                                  \
            _mm512_add_ps(_mm512_permutex2var_ps(v[2 * j], il, v[2 * j + 1]),                             \
                          _mm512_permutex2var_ps(v[2 * j], ih, v[2 * j + 1]));                            \
    } while (0)
    HSUM_LEVEL(0, 16);
    HSUM_LEVEL(1, 8);
    HSUM_LEVEL(2, 4);
    HSUM_LEVEL(3, 2);
#undef HSUM_LEVEL
    return v[0];
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

#if defined(__AVX2__)
/* the sum of v's 8 lanes (a fixed order: halves, then pairs) */
static inline float hsum256(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* e^x for 8 lanes: the same polynomial as exp512; 2^n built in the exponent bits (n in [-126, 127]). */
static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
    const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(t, n);
    __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

/* In place: s[0..L) -> exp(s - max(s)); returns the sum (L >= 1) and, when m_out is not NULL, the max
 * (so the log-sum-exp of the row is *m_out + log(sum)). */
static inline float softmax_numerators(float *s, int64_t L, float *m_out) {
    int64_t l = 0;
    float m = -INFINITY, sum = 0.f;
#if defined(__AVX512F__)
    __m512 vm = _mm512_set1_ps(-INFINITY);
    for (; l + 16 <= L; l += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + l));
    /* the last L % 16 lanes under a mask (the row's scores are the only values read or written) */
    const __mmask16 tail = (__mmask16)((1u << (L - l)) - 1u);
    vm = _mm512_max_ps(vm, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail, s + l));
    m = _mm512_reduce_max_ps(vm);
    const __m512 mv = _mm512_set1_ps(m);
    __m512 vs = _mm512_setzero_ps();
    for (l = 0; l + 16 <= L; l += 16) {
        const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + l), mv));
        _mm512_storeu_ps(s + l, e);
        vs = _mm512_add_ps(vs, e);
    }
    if (tail) {
        const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + l), mv));
        _mm512_mask_storeu_ps(s + l, tail, e);
        vs = _mm512_mask_add_ps(vs, tail, vs, e);
        l = L;
    }
    sum = _mm512_reduce_add_ps(vs);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 vm = _mm256_set1_ps(-INFINITY);
    for (; l + 8 <= L; l += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + l));
    float mm[8];
    _mm256_storeu_ps(mm, vm);
    for (int i = 0; i < 8; i++) m = mm[i] > m ? mm[i] : m;
    for (int64_t i = l; i < L; i++) m = s[i] > m ? s[i] : m;
    const __m256 mv = _mm256_set1_ps(m);
    __m256 vs = _mm256_setzero_ps();
    for (l = 0; l + 8 <= L; l += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + l), mv));
        _mm256_storeu_ps(s + l, e);
        vs = _mm256_add_ps(vs, e);
    }
    _mm256_storeu_ps(mm, vs);
    for (int i = 0; i < 8; i++) sum += mm[i];
#else
    for (int64_t i = 0; i < L; i++) m = s[i] > m ? s[i] : m;
#endif
    for (; l < L; l++) {
        s[l] = expf(s[l] - m);
        sum += s[l];
    }
    if (m_out) *m_out = m;
    return sum;
}

/* Cascade attention's merge (attention/cascade.py): o [D] is a normalised output with log-sum-exp
 * lse; prior [D] another one over disjoint keys with prior_lse (-inf: no keys, o is kept). In place:
 * o = (o e^(lse - m) + prior e^(prior_lse - m)) / (e^(lse - m) + e^(prior_lse - m)), m the larger. */
static inline void merge_prior(float *o, int64_t D, float lse, const float *prior, float prior_lse) {
    if (prior_lse == -INFINITY) return;
    const float m = lse > prior_lse ? lse : prior_lse;
    const float a = expf(lse - m), b = expf(prior_lse - m), inv = 1.f / (a + b);
    for (int64_t d = 0; d < D; d++) o[d] = (o[d] * a + prior[d] * b) * inv;
}

/* Extend attention work split: tasks (request, KV head, block of qb queries), so blocks keep every
 * thread busy on one long prompt. task_off[r] = first task of request r, task_off[R] = the count
 * (malloc'd, NULL when out of memory); extend_task_request finds the request of a task. */
static inline int64_t *extend_task_offsets(const int64_t *lens, int64_t R, int64_t Hkv, int64_t qb) {
    int64_t *off = (int64_t *)malloc(sizeof(int64_t) * (size_t)(R + 1));
    if (!off) return NULL;
    off[0] = 0;
    for (int64_t r = 0; r < R; r++) off[r + 1] = off[r] + (lens[r] + qb - 1) / qb * Hkv;
    return off;
}

/* Queries per attend task: up to max_qb, halved (down to 16) while there are fewer than 4 tasks per
 * thread, so a small batch (a decode step's 64 rows against a shared prefix) still fills every thread. */
static inline int64_t extend_query_block(const int64_t *lens, int64_t R, int64_t Hkv, int64_t max_qb) {
    const int64_t want = 4 * (int64_t)omp_get_max_threads();
    int64_t qb = max_qb;
    for (; qb > 16; qb /= 2) {
        int64_t tasks = 0;
        for (int64_t r = 0; r < R && tasks < want; r++) tasks += (lens[r] + qb - 1) / qb * Hkv;
        if (tasks >= want) break;
    }
    return qb;
}

/* The work of one extend call (extend_attention.c, extend_impl.h). Per segment r: npool[r] pool keys
 * (positions k_begin[r] .. prefix_lens[r] - 1), nkeys[r] = npool[r] + its new keys (lens[r] when the
 * call has new tokens), nal[r] = nkeys[r] rounded up to `align`; pk_off[r]: where its block packed
 * ahead starts (Hkv blocks of words_per_key * nal[r] words). Only segments read by more than one query
 * block are packed ahead (ahead[r] = nal[r], else 0): the others pack in their one attend task, while
 * the keys stay in cache. Tasks: pack_task (segment, KV head, kc keys) over the packed-ahead segments,
 * task_off (segment, KV head, qb queries). max_al / own_al: the largest nal, and among the others. */
typedef struct {
    int64_t *npool, *nkeys, *nal, *ahead, *pk_off, *pack_task, *task_off;
    int64_t qb, max_al, own_al;
} extend_plan;

static inline void extend_plan_free(extend_plan *p) {
    free(p->npool), free(p->pack_task), free(p->task_off);
}

/* 0, or -2 when memory runs out (extend_plan_free is then still safe to call). */
static inline int extend_plan_make(extend_plan *p, const int64_t *lens, int64_t R, int64_t Hkv,
                                   const int64_t *prefix_lens, const int64_t *k_begin, int has_new, int64_t align,
                                   int64_t words_per_key, int64_t max_qb, int64_t kc) {
    memset(p, 0, sizeof *p);
    p->npool = (int64_t *)malloc(sizeof(int64_t) * (size_t)(5 * R + 1));
    if (!p->npool) return -2;
    p->nkeys = p->npool + R, p->nal = p->npool + 2 * R, p->ahead = p->npool + 3 * R, p->pk_off = p->npool + 4 * R;
    p->qb = extend_query_block(lens, R, Hkv, max_qb);
    p->max_al = p->own_al = align;
    p->pk_off[0] = 0;
    for (int64_t r = 0; r < R; r++) {
        p->npool[r] = prefix_lens ? prefix_lens[r] - (k_begin ? k_begin[r] : 0) : 0;
        p->nkeys[r] = p->npool[r] + (has_new ? lens[r] : 0);
        p->nal[r] = (p->nkeys[r] + align - 1) / align * align;
        p->max_al = p->nal[r] > p->max_al ? p->nal[r] : p->max_al;
        p->ahead[r] = lens[r] > p->qb ? p->nal[r] : 0;
        if (!p->ahead[r]) p->own_al = p->nal[r] > p->own_al ? p->nal[r] : p->own_al;
        p->pk_off[r + 1] = p->pk_off[r] + Hkv * words_per_key * p->ahead[r];
    }
    p->pack_task = extend_task_offsets(p->ahead, R, Hkv, kc);
    p->task_off = extend_task_offsets(lens, R, Hkv, p->qb);
    return p->pack_task && p->task_off ? 0 : -2;
}

/* Sliding-window attention (window > 0; 0: none): the first key index row j of segment r may see; the
 * scores of keys before it are set to -inf (window_mask) and their numerators to 0 (window_zero). Keys
 * are positions k_begin[r] + l (pool, then new); the row's query sits at position prefix_lens[r] + j
 * with new keys (has_new), else at prefix_lens[r] - 1 (a decode row: its own key is the last pool key).
 * A query at position p sees the keys at positions (p - window, p] (transformers' sliding_window).
 * Masking in place keeps every score at its key's lane, whatever the window: the deterministic mode's
 * decode rows and prefills then sum the same values in the same order. */
static inline int64_t window_first_key(int64_t window, const int64_t *prefix_lens, const int64_t *k_begin,
                                       int has_new, int64_t r, int64_t j) {
    if (window <= 0) return 0;
    const int64_t pre = prefix_lens ? prefix_lens[r] : 0, p = has_new ? pre + j : pre - 1;
    const int64_t lo = p - window + 1 - (prefix_lens && k_begin ? k_begin[r] : 0);
    return lo > 0 ? lo : 0;
}

static inline void window_mask(float *s, int64_t lo) {
    for (int64_t l = 0; l < lo; l++) s[l] = -INFINITY;
}

/* after softmax_numerators: exp512 clamps at e^-87, so the masked numerators are zeroed explicitly */
static inline void window_zero(float *s, int64_t lo) {
    for (int64_t l = 0; l < lo; l++) s[l] = 0.f;
}

static inline int64_t extend_task_request(const int64_t *off, int64_t R, int64_t task) {
    int64_t r = 0, lo = 0, hi = R - 1;
    while (lo <= hi) {
        const int64_t mid = (lo + hi) / 2;
        if (off[mid] <= task) r = mid, lo = mid + 1;
        else hi = mid - 1;
    }
    return r;
}
#endif
