/* Body of a weight-streaming GEMV for decode-sized batches, included once per weight format by gemv.c:
 *   out[m, n] = SCALE(n) * sum_k xf[m, k] * W(n, k) + bias[n]      m < M, n < N
 * xf [M, K] float32 (the caller converts the activations once), W: N rows of ROW_BYTES(K) bytes each
 * (int8 values, or GGUF Q4_1 / Q8_0 blocks of 32), out [M, N] float32 or bf16 (out_bf16), bias [N]
 * float32 or NULL.
 *
 * Decode reads every weight once per step, so this is bandwidth-bound, and one row at a time is not
 * enough: a row's K/16 fused multiply-adds form one dependent chain (4-cycle latency), which caps a
 * core near 4 bytes per cycle. Four rows at a time (GEMV_ROWS) give 4 x M independent chains; rows
 * are split over the OpenMP threads in blocks of four, inputs in groups of up to four (a block's
 * rows stay in L1 while each group passes over them). A tail block repeats the last row rather
 * than branching; only real rows are stored.
 *
 * Needs before inclusion: GEMV_NAME, GEMV_BLOCK_FN (names), ROW_BYTES(K); LOADW16(row, k) -> __m512
 * (AVX-512), LOADW8(row, k) -> __m256 (AVX2), LOADW1(row, k) -> float: weights k.. of a row (k a
 * multiple of 16 / 8), dequantized; SCALE(n) -> float. Optional DOT32(row, k, x0, x1, xs, acc, mc):
 * AVX-512, a whole 32-weight block at a time (acc[m] += the block's contribution for input m).
 * The file undefines them all at its end.
 */

static inline __attribute__((always_inline)) void GEMV_BLOCK_FN(const float *xf, const uint8_t *w, const float *scale,
                                                                const float *bias, void *out, int out_bf16,
                                                                int64_t K, int64_t N, int64_t n0, int64_t m0,
                                                                const int mc) {
    const uint8_t *rows[GEMV_ROWS];
    const int64_t row_bytes = ROW_BYTES(K);
    for (int r = 0; r < GEMV_ROWS; r++) rows[r] = w + (n0 + r < N ? n0 + r : N - 1) * row_bytes;
    float sums[GEMV_ROWS][GEMV_GROUP];
    int64_t k = 0;
#if defined(__AVX512F__)
    __m512 acc[GEMV_ROWS][GEMV_GROUP];
    for (int r = 0; r < GEMV_ROWS; r++)
        for (int m = 0; m < mc; m++) acc[r][m] = _mm512_setzero_ps();
#ifdef DOT32
    /* block formats: one step per 32-weight block; the block's scale applies once to its partial dot */
    for (; k + 32 <= K; k += 32) {
        __m512 x0[GEMV_GROUP], x1[GEMV_GROUP], xs[GEMV_GROUP];
        for (int m = 0; m < mc; m++) {
            x0[m] = _mm512_loadu_ps(xf + (m0 + m) * K + k);
            x1[m] = _mm512_loadu_ps(xf + (m0 + m) * K + k + 16);
            xs[m] = _mm512_add_ps(x0[m], x1[m]);  /* lanes sum to the block's sum of x */
        }
        for (int r = 0; r < GEMV_ROWS; r++) {
            _mm_prefetch((const char *)(rows[r] + ROW_BYTES(k) + GEMV_PREFETCH_ROWS * row_bytes), _MM_HINT_T0);
            DOT32(rows[r], k, x0, x1, xs, acc[r], mc);
        }
    }
#endif
    for (; k + 16 <= K; k += 16) {
        __m512 wv[GEMV_ROWS];
        for (int r = 0; r < GEMV_ROWS; r++) {
            _mm_prefetch((const char *)(rows[r] + ROW_BYTES(k) + GEMV_PREFETCH_ROWS * row_bytes), _MM_HINT_T0);
            wv[r] = LOADW16(rows[r], k);
        }
        for (int m = 0; m < mc; m++) {
            const __m512 xv = _mm512_loadu_ps(xf + (m0 + m) * K + k);
            for (int r = 0; r < GEMV_ROWS; r++) acc[r][m] = _mm512_fmadd_ps(wv[r], xv, acc[r][m]);
        }
    }
    for (int r = 0; r < GEMV_ROWS; r++)
        for (int m = 0; m < mc; m++) sums[r][m] = _mm512_reduce_add_ps(acc[r][m]);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc[GEMV_ROWS][GEMV_GROUP];
    for (int r = 0; r < GEMV_ROWS; r++)
        for (int m = 0; m < mc; m++) acc[r][m] = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) {
        __m256 wv[GEMV_ROWS];
        for (int r = 0; r < GEMV_ROWS; r++) wv[r] = LOADW8(rows[r], k);
        for (int m = 0; m < mc; m++) {
            const __m256 xv = _mm256_loadu_ps(xf + (m0 + m) * K + k);
            for (int r = 0; r < GEMV_ROWS; r++) acc[r][m] = _mm256_fmadd_ps(wv[r], xv, acc[r][m]);
        }
    }
    for (int r = 0; r < GEMV_ROWS; r++)
        for (int m = 0; m < mc; m++) sums[r][m] = hsum256(acc[r][m]);
#else
    for (int r = 0; r < GEMV_ROWS; r++)
        for (int m = 0; m < mc; m++) sums[r][m] = 0.f;
#endif
    for (; k < K; k++)
        for (int r = 0; r < GEMV_ROWS; r++)
            for (int m = 0; m < mc; m++) sums[r][m] += LOADW1(rows[r], k) * xf[(m0 + m) * K + k];
    for (int r = 0; r < GEMV_ROWS && n0 + r < N; r++) {
        const int64_t n = n0 + r;
        for (int m = 0; m < mc; m++) {
            const float v = sums[r][m] * SCALE(n) + (bias ? bias[n] : 0.f);
            if (out_bf16)
                ((uint16_t *)out)[(m0 + m) * N + n] = f32_to_bf16(v);
            else
                ((float *)out)[(m0 + m) * N + n] = v;
        }
    }
}

static void GEMV_NAME(const float *xf, const uint8_t *w, const float *scale, const float *bias, void *out, int out_bf16,
                      int64_t M, int64_t K, int64_t N) {
#pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += GEMV_ROWS) {
        for (int64_t m0 = 0; m0 < M; m0 += GEMV_GROUP) {
            switch (M - m0 >= GEMV_GROUP ? GEMV_GROUP : (int)(M - m0)) {  /* constant group sizes unroll */
                case 1: GEMV_BLOCK_FN(xf, w, scale, bias, out, out_bf16, K, N, n0, m0, 1); break;
                case 2: GEMV_BLOCK_FN(xf, w, scale, bias, out, out_bf16, K, N, n0, m0, 2); break;
                case 3: GEMV_BLOCK_FN(xf, w, scale, bias, out, out_bf16, K, N, n0, m0, 3); break;
                default: GEMV_BLOCK_FN(xf, w, scale, bias, out, out_bf16, K, N, n0, m0, 4); break;
            }
        }
    }
}

/* the parameters are this inclusion's only: the next format defines its own */
#undef GEMV_NAME
#undef GEMV_BLOCK_FN
#undef ROW_BYTES
#undef LOADW16
#undef LOADW8
#undef LOADW1
#undef SCALE
#undef DOT32
