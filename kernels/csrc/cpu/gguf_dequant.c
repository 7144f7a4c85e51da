/*
 * GGUF rows of blocks -> float32 / bf16 weights (every type of gguf_blocks.h): the exact values
 * gguf.quants.dequantize gives (s q + o in float32 with no fused multiply-add: the products and sums
 * round as numpy's do), so a float32 model on the blocks holds the dequantized checkpoint's weights.
 * Larger batches (gguf_block_linear.py) dequantize a tile of rows per call and run a GEMM on it; the
 * embedding lookup dequantizes the rows of its tokens.
 */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#include "common.h"
#include "gguf_blocks.h"
#include "kernels.h"

/* out [n_rows, K] (bf16 when out_bf16, else float32) = rows rows[i] (NULL: row0 + i) of W (rows of K / QK
 * blocks of ggml type `type`) dequantized. -1: a type not read here or K not a multiple of its block. */
int gguf_dequant_rows(const uint8_t *w, int64_t type, int64_t K, const int64_t *rows, int64_t row0, int64_t n_rows,
                      void *out, int out_bf16) {
    const int qk = gguf_block_len(type);
    if (!qk || K < qk || K % qk || n_rows < 0) return -1;
    const int64_t row_bytes = K / qk * gguf_block_bytes(type), nc = (K + KQ_CHUNK - 1) / KQ_CHUNK;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n_rows; i++) {
        kq_chunk c;
        const uint8_t *row = w + (rows ? rows[i] : row0 + i) * row_bytes;
        for (int64_t ci = 0; ci < nc; ci++) {
            kq_read_chunk(row, type, K, ci, &c);
            const int64_t len = K - ci * KQ_CHUNK < KQ_CHUNK ? K - ci * KQ_CHUNK : KQ_CHUNK; /* a multiple of 32 */
            float v[KQ_CHUNK];
            for (int k = 0; k < KQ_CHUNK / 16; k++)
                for (int j = 0; j < 16; j++) v[16 * k + j] = c.s[k] * (float)c.q[16 * k + j] + c.o[k];
            const int64_t at = i * K + ci * KQ_CHUNK;
            if (out_bf16) {
                uint16_t *o = (uint16_t *)out + at;
                for (int64_t j = 0; j < len; j++) o[j] = f32_to_bf16(v[j]);
            } else {
                memcpy((float *)out + at, v, (size_t)len * sizeof(float));
            }
        }
    }
    return 0;
}

/* out [M, N] (bf16 when out_bf16, else float32) = x [M, K] (bf16 when x_bf16) @ W.T in float32 sums over the
 * dequantized values above (each chunk of a row dequantized once, in registers / L1, for every input row;
 * a short last chunk only over its weights): a float32 model's decode batches read the blocks only and
 * keep the exact weights. -1: refused (a type not read here, K not a multiple of its block, M outside
 * 1 .. 256); -2: out of memory. */
int gguf_dequant_gemv(const void *x, int x_bf16, const uint8_t *w, int64_t type, void *out, int out_bf16, int64_t M,
                      int64_t K, int64_t N) {
    const int qk = gguf_block_len(type);
    if (!qk || K < qk || K % qk || M < 1 || M > 256 || N < 1) return -1;
    const int64_t kp = (K + KQ_CHUNK - 1) / KQ_CHUNK * KQ_CHUNK, nc = kp / KQ_CHUNK;
    float *xf = (float *)calloc((size_t)(M * kp), sizeof(float)); /* [M, kp] x in float32, zero padded */
    if (!xf) return -2;
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++)
            xf[m * kp + k] = x_bf16 ? bf16_to_f32(((const uint16_t *)x)[m * K + k]) : ((const float *)x)[m * K + k];
    const int64_t row_bytes = K / qk * gguf_block_bytes(type);
    int rc = 0;
#pragma omp parallel
    {
        float *acc = (float *)aligned_alloc(64, (size_t)M * 16 * sizeof(float)); /* acc[m][lane] */
        if (!acc) {
#pragma omp atomic write
            rc = -2;
        }
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            if (!acc) continue;
            kq_chunk c;
            float v[KQ_CHUNK];
            memset(acc, 0, (size_t)M * 16 * sizeof(float));
            for (int64_t ci = 0; ci < nc; ci++) {
                const int64_t len = K - ci * KQ_CHUNK < KQ_CHUNK ? K - ci * KQ_CHUNK : KQ_CHUNK; /* a multiple of 32 */
                kq_read_chunk(w + n * row_bytes, type, K, ci, &c);
                for (int k = 0; k < len / 16; k++)
                    for (int j = 0; j < 16; j++) v[16 * k + j] = c.s[k] * (float)c.q[16 * k + j] + c.o[k];
                for (int64_t m = 0; m < M; m++) {
                    const float *xm = xf + m * kp + ci * KQ_CHUNK;
                    float *am = acc + 16 * m;
                    for (int j = 0; j < len; j += 16)
                        for (int l = 0; l < 16; l++) am[l] += v[j + l] * xm[j + l];
                }
            }
            for (int64_t m = 0; m < M; m++) {
                float sum = 0.f;
                for (int l = 0; l < 16; l++) sum += acc[16 * m + l];
                if (out_bf16)
                    ((uint16_t *)out)[m * N + n] = f32_to_bf16(sum);
                else
                    ((float *)out)[m * N + n] = sum;
            }
        }
        free(acc);
    }
    free(xf);
    return rc;
}
