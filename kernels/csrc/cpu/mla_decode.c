/*
 * Multi-head latent attention decode, absorbed form (DeepSeek V2 / V3), reading one layer's latent entries in
 * place, bf16 and float32.
 *
 * q [B, H, E] contiguous, E = C + R: each head's query in latent space (q_nope times W_UK, C lanes) then its
 * roped part (R lanes); pool [N, E] contiguous: per slot the latent (C lanes) then the roped key (R lanes), the
 * values being the latents; req_to_token [rows, ctx] int64; req_rows [B], seq_lens [B] int64.
 * out [B, H, C]: for row b and head h, softmax_l(scale * q[b, h] . pool[slot_l]) over l < seq_lens[b] (slot_l =
 * req_to_token[req_rows[b], l]) times pool[slot_l][:C]. Attention as MQA: each cached entry is converted to
 * float32 once per block of MLA_HB heads of a row and serves all of them; an online softmax (float32 running
 * max, sum and accumulators) reads every entry once. Threads split the (row, head block) pairs.
 * Returns 0; -1 on a sequence length outside (0, ctx] or a slot outside [0, N); -2 out of memory.
 */
#include "common.h"
#include "kernels.h"

#define MLA_HB 16

static void mla_row_f32(const float *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

static void mla_row_bf16(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}

/* a . b in 16 independent partial sums (the compiler vectorizes them; one running sum it may not reorder) */
static inline float mla_dot(const float *a, const float *b, int64_t n) {
    float part[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) part[j] += a[i + j] * b[i + j];
    float d = 0.0f;
    for (int j = 0; j < 16; j++) d += part[j];
    for (; i < n; i++) d += a[i] * b[i];
    return d;
}

/* one (row, head block): qf [hn, E] float32, row scratch [E]; acc [hn, C] -> o (float32, then stored) */
static int mla_block(const void *pool, int bf16, const int64_t *slots, int64_t L, int64_t N, int64_t C,
                     int64_t E, int64_t hn, const float *qf, float scale, float *row, float *acc, float *m,
                     float *sum) {
    for (int64_t h = 0; h < hn; h++) {
        m[h] = -INFINITY;
        sum[h] = 0.0f;
    }
    memset(acc, 0, (size_t)(hn * C) * sizeof(float));
    for (int64_t l = 0; l < L; l++) {
        int64_t slot = slots[l];
        if (slot < 0 || slot >= N) return -1;
        if (bf16)
            mla_row_bf16((const uint16_t *)pool + slot * E, row, E);
        else
            mla_row_f32((const float *)pool + slot * E, row, E);
        for (int64_t h = 0; h < hn; h++) {
            float d = mla_dot(qf + h * E, row, E) * scale;
            float *ah = acc + h * C;
            if (d > m[h]) {  /* a new max: rescale what was summed so far */
                float c = expf(m[h] - d);
                sum[h] *= c;
                for (int64_t i = 0; i < C; i++) ah[i] *= c;
                m[h] = d;
            }
            float p = expf(d - m[h]);
            sum[h] += p;
            for (int64_t i = 0; i < C; i++) ah[i] += p * row[i];
        }
    }
    return 0;
}

static int mla_decode(const void *q, const void *pool, int bf16, const int64_t *req_to_token,
                      const int64_t *req_rows, const int64_t *seq_lens, int64_t B, int64_t H, int64_t C,
                      int64_t R, int64_t N, int64_t ctx, float scale, void *out) {
    const int64_t E = C + R, nhb = (H + MLA_HB - 1) / MLA_HB;
    int status = 0;
#pragma omp parallel for schedule(dynamic)
    for (int64_t t = 0; t < B * nhb; t++) {
        int64_t b = t / nhb, h0 = (t % nhb) * MLA_HB;
        int64_t hn = H - h0 < MLA_HB ? H - h0 : MLA_HB, L = seq_lens[b];
        if (L <= 0 || L > ctx) {
#pragma omp atomic write
            status = -1;
            continue;
        }
        float *buf = malloc((size_t)(hn * E + E + hn * C + 2 * hn) * sizeof(float));
        if (!buf) {
#pragma omp atomic write
            status = -2;
            continue;
        }
        float *qf = buf, *row = qf + hn * E, *acc = row + E, *m = acc + hn * C, *sum = m + hn;
        int64_t q0 = (b * H + h0) * E;
        if (bf16)
            mla_row_bf16((const uint16_t *)q + q0, qf, hn * E);
        else
            mla_row_f32((const float *)q + q0, qf, hn * E);
        int rc = mla_block(pool, bf16, req_to_token + req_rows[b] * ctx, L, N, C, E, hn, qf, scale, row, acc, m,
                           sum);
        if (rc != 0) {
#pragma omp atomic write
            status = rc;
        } else {
            for (int64_t h = 0; h < hn; h++) {
                float inv = 1.0f / sum[h];
                int64_t o0 = (b * H + h0 + h) * C;
                for (int64_t i = 0; i < C; i++) {
                    float v = acc[h * C + i] * inv;
                    if (bf16)
                        ((uint16_t *)out)[o0 + i] = f32_to_bf16(v);
                    else
                        ((float *)out)[o0 + i] = v;
                }
            }
        }
        free(buf);
    }
    return status;
}

int mla_decode_bf16(const uint16_t *q, const uint16_t *pool, const int64_t *req_to_token, const int64_t *req_rows,
                    const int64_t *seq_lens, int64_t B, int64_t H, int64_t C, int64_t R, int64_t N, int64_t ctx,
                    float scale, uint16_t *out) {
    return mla_decode(q, pool, 1, req_to_token, req_rows, seq_lens, B, H, C, R, N, ctx, scale, out);
}

int mla_decode_f32(const float *q, const float *pool, const int64_t *req_to_token, const int64_t *req_rows,
                   const int64_t *seq_lens, int64_t B, int64_t H, int64_t C, int64_t R, int64_t N, int64_t ctx,
                   float scale, float *out) {
    return mla_decode(q, pool, 0, req_to_token, req_rows, seq_lens, B, H, C, R, N, ctx, scale, out);
}
