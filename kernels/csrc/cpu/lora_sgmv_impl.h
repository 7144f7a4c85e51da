/* Body of the LoRA segment kernels (lora_sgmv.c), included once per element type:
 *   LORA_T (float or uint16_t bf16), LORA_NAME(base) (the entry point's name), LOAD16(p) -> __m512 (AVX-512),
 *   LOAD8(p) -> __m256 (AVX2), LOAD1(p) -> float, STORE16(p, v), STORE8(p, v), STORE1(p, f).
 * Sums and t in float32; y rounded once per element (bf16: to nearest even). The file undefines them all. */

static inline float LORA_NAME(dot)(const LORA_T *a, const LORA_T *b, int64_t K) {
    int64_t k = 0;
    float s = 0.f;
#if defined(__AVX512F__)
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; k + 32 <= K; k += 32) {
        acc0 = _mm512_fmadd_ps(LOAD16(a + k), LOAD16(b + k), acc0);
        acc1 = _mm512_fmadd_ps(LOAD16(a + k + 16), LOAD16(b + k + 16), acc1);
    }
    if (k + 16 <= K) {
        acc0 = _mm512_fmadd_ps(LOAD16(a + k), LOAD16(b + k), acc0);
        k += 16;
    }
    s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; k + 16 <= K; k += 16) {
        acc0 = _mm256_fmadd_ps(LOAD8(a + k), LOAD8(b + k), acc0);
        acc1 = _mm256_fmadd_ps(LOAD8(a + k + 8), LOAD8(b + k + 8), acc1);
    }
    s = hsum256(_mm256_add_ps(acc0, acc1));
#endif
    for (; k < K; k++) s += LOAD1(a + k) * LOAD1(b + k);
    return s;
}

/* y[0:n] += sum_q tr[q] * bt[q, 0:n] (bt [r, n] row-major): each block of y read and written once */
static inline void LORA_NAME(expand_row)(LORA_T *y, const float *tr, const LORA_T *bt, int64_t r, int64_t n) {
    int64_t c = 0;
#if defined(__AVX512F__)
    for (; c + 32 <= n; c += 32) {
        __m512 a0 = LOAD16(y + c), a1 = LOAD16(y + c + 16);
        for (int64_t q = 0; q < r; q++) {
            const __m512 tq = _mm512_set1_ps(tr[q]);
            a0 = _mm512_fmadd_ps(tq, LOAD16(bt + q * n + c), a0);
            a1 = _mm512_fmadd_ps(tq, LOAD16(bt + q * n + c + 16), a1);
        }
        STORE16(y + c, a0);
        STORE16(y + c + 16, a1);
    }
    for (; c + 16 <= n; c += 16) {
        __m512 a0 = LOAD16(y + c);
        for (int64_t q = 0; q < r; q++) a0 = _mm512_fmadd_ps(_mm512_set1_ps(tr[q]), LOAD16(bt + q * n + c), a0);
        STORE16(y + c, a0);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (; c + 16 <= n; c += 16) {
        __m256 a0 = LOAD8(y + c), a1 = LOAD8(y + c + 8);
        for (int64_t q = 0; q < r; q++) {
            const __m256 tq = _mm256_set1_ps(tr[q]);
            a0 = _mm256_fmadd_ps(tq, LOAD8(bt + q * n + c), a0);
            a1 = _mm256_fmadd_ps(tq, LOAD8(bt + q * n + c + 8), a1);
        }
        STORE8(y + c, a0);
        STORE8(y + c + 8, a1);
    }
#endif
    for (; c < n; c++) {
        float acc = LOAD1(y + c);
        for (int64_t q = 0; q < r; q++) acc += tr[q] * LOAD1(bt + q * n + c);
        STORE1(y + c, acc);
    }
}

int LORA_NAME(lora_shrink)(const LORA_T *x, int64_t xs, const int64_t *rows, const int64_t *seg_starts, int64_t S,
                           const LORA_T *const *a, const int64_t *ranks, int64_t K, float *t, int64_t ts) {
    for (int64_t s = 0; s < S; s++)
        if (ranks[s] < 1 || ranks[s] > LORA_MAX_RANK || ranks[s] > ts) return -1;
    const int64_t total = seg_starts[S] - seg_starts[0];
#pragma omp parallel for schedule(static) if (total * K >= 32768)
    for (int64_t j = seg_starts[0]; j < seg_starts[S]; j++) {
        int64_t s = 0;
        while (seg_starts[s + 1] <= j) s++;
        const LORA_T *xr = x + rows[j] * xs, *as = a[s];
        float *tr = t + j * ts;
        for (int64_t i = 0; i < ranks[s]; i++) tr[i] = LORA_NAME(dot)(xr, as + i * K, K);
    }
    return 0;
}

int LORA_NAME(lora_expand)(const float *t, int64_t ts, const int64_t *rows, const int64_t *seg_starts,
                           const int64_t *tasks, int64_t NT, const LORA_T *const *b, LORA_T *y, int64_t ys) {
    for (int64_t i = 0; i < NT; i++) {
        const int64_t *tk = tasks + 5 * i;
        if (tk[2] < 1 || tk[2] > LORA_MAX_RANK || tk[1] + tk[2] > ts) return -1;
    }
    for (int64_t i = 0; i < NT; i++) {
        const int64_t *tk = tasks + 5 * i;
        const int64_t seg = tk[0], col = tk[1], r = tk[2], off = tk[3], n = tk[4];
        const LORA_T *bt = b[i];
        const int64_t lo = seg_starts[seg], hi = seg_starts[seg + 1];
#pragma omp parallel for schedule(static) if ((hi - lo) * n * r >= 65536)
        for (int64_t j = lo; j < hi; j++) LORA_NAME(expand_row)(y + rows[j] * ys + off, t + j * ts + col, bt, r, n);
    }
    return 0;
}

#undef LORA_T
#undef LORA_NAME
#undef LOAD16
#undef LOAD8
#undef LOAD1
#undef STORE16
#undef STORE8
#undef STORE1
