/*
 * Batched LoRA over row segments (SGMV: segmented gather matrix-vector), float32.
 *
 * lora_shrink_f32: segment s covers positions j in [seg_starts[s], seg_starts[s + 1]) of the step's row list
 *   rows[]; for each: t[j, 0:r_s] = x[rows[j]] @ A_s^T, A_s = a[s] [r_s, K] row-major (the adapter's A of every
 *   sub-projection stacked).
 * lora_expand_f32: task i (5 int64 in tasks: segment, column in t, rank r, output offset, output width n) adds
 *   y[rows[j], off:off + n] += t[j, col:col + r] @ Bt_i for j in its segment; Bt_i = b[i] [r, n] row-major
 *   (B transposed, the scaling folded in).
 * x, y: row strides xs, ys (elements); t: row stride ts. AVX-512F / AVX2+FMA / plain C bodies, chosen by the
 * build's target flags (cpu_caps). Returns 0, or -1 when a shape is outside the limits (a rank above
 * LORA_MAX_RANK).
 */
#include "common.h"
#include "kernels.h"

#define LORA_MAX_RANK 1024

static inline float dot_f32(const float *a, const float *b, int64_t K) {
    int64_t k = 0;
    float s = 0.f;
#if defined(__AVX512F__)
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; k + 32 <= K; k += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k + 16), _mm512_loadu_ps(b + k + 16), acc1);
    }
    if (k + 16 <= K) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), acc0);
        k += 16;
    }
    if (k < K) {
        const __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
        acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k), acc1);
        k = K;
    }
    s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; k + 16 <= K; k += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), acc1);
    }
    acc0 = _mm256_add_ps(acc0, acc1);
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    s = _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
#endif
    for (; k < K; k++) s += a[k] * b[k];
    return s;
}

/* y[0:n] += sum_q tr[q] * bt[q, 0:n] (bt [r, n] row-major): each block of y read and written once */
static inline void expand_row_f32(float *y, const float *tr, const float *bt, int64_t r, int64_t n) {
    int64_t c = 0;
#if defined(__AVX512F__)
    for (; c + 32 <= n; c += 32) {
        __m512 a0 = _mm512_loadu_ps(y + c), a1 = _mm512_loadu_ps(y + c + 16);
        for (int64_t q = 0; q < r; q++) {
            const __m512 tq = _mm512_set1_ps(tr[q]);
            a0 = _mm512_fmadd_ps(tq, _mm512_loadu_ps(bt + q * n + c), a0);
            a1 = _mm512_fmadd_ps(tq, _mm512_loadu_ps(bt + q * n + c + 16), a1);
        }
        _mm512_storeu_ps(y + c, a0);
        _mm512_storeu_ps(y + c + 16, a1);
    }
    for (; c + 16 <= n; c += 16) {
        __m512 a0 = _mm512_loadu_ps(y + c);
        for (int64_t q = 0; q < r; q++) a0 = _mm512_fmadd_ps(_mm512_set1_ps(tr[q]), _mm512_loadu_ps(bt + q * n + c), a0);
        _mm512_storeu_ps(y + c, a0);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (; c + 16 <= n; c += 16) {
        __m256 a0 = _mm256_loadu_ps(y + c), a1 = _mm256_loadu_ps(y + c + 8);
        for (int64_t q = 0; q < r; q++) {
            const __m256 tq = _mm256_set1_ps(tr[q]);
            a0 = _mm256_fmadd_ps(tq, _mm256_loadu_ps(bt + q * n + c), a0);
            a1 = _mm256_fmadd_ps(tq, _mm256_loadu_ps(bt + q * n + c + 8), a1);
        }
        _mm256_storeu_ps(y + c, a0);
        _mm256_storeu_ps(y + c + 8, a1);
    }
#endif
    for (; c < n; c++) {
        float acc = y[c];
        for (int64_t q = 0; q < r; q++) acc += tr[q] * bt[q * n + c];
        y[c] = acc;
    }
}

int lora_shrink_f32(const float *x, int64_t xs, const int64_t *rows, const int64_t *seg_starts, int64_t S,
                    const float *const *a, const int64_t *ranks, int64_t K, float *t, int64_t ts) {
    for (int64_t s = 0; s < S; s++)
        if (ranks[s] < 1 || ranks[s] > LORA_MAX_RANK || ranks[s] > ts) return -1;
    const int64_t total = seg_starts[S] - seg_starts[0];
    /* positions x ranks of every segment flattened: small decode steps still spread over the threads */
#pragma omp parallel for schedule(static) if (total * K >= 32768)
    for (int64_t j = seg_starts[0]; j < seg_starts[S]; j++) {
        int64_t s = 0;
        while (seg_starts[s + 1] <= j) s++;
        const float *xr = x + rows[j] * xs, *as = a[s];
        float *tr = t + j * ts;
        for (int64_t i = 0; i < ranks[s]; i++) tr[i] = dot_f32(xr, as + i * K, K);
    }
    return 0;
}

int lora_expand_f32(const float *t, int64_t ts, const int64_t *rows, const int64_t *seg_starts, const int64_t *tasks,
                    int64_t NT, const float *const *b, float *y, int64_t ys) {
    for (int64_t i = 0; i < NT; i++) {
        const int64_t *tk = tasks + 5 * i;
        if (tk[2] < 1 || tk[2] > LORA_MAX_RANK || tk[1] + tk[2] > ts) return -1;
    }
    for (int64_t i = 0; i < NT; i++) {
        const int64_t *tk = tasks + 5 * i;
        const int64_t seg = tk[0], col = tk[1], r = tk[2], off = tk[3], n = tk[4];
        const float *bt = b[i];
        const int64_t lo = seg_starts[seg], hi = seg_starts[seg + 1];
#pragma omp parallel for schedule(static) if ((hi - lo) * n * r >= 65536)
        for (int64_t j = lo; j < hi; j++) {
            const float *tr = t + j * ts + col;
            float *yr = y + rows[j] * ys + off;
            expand_row_f32(yr, tr, bt, r, n);
        }
    }
    return 0;
}
