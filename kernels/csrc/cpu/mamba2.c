/*
 * Mamba2 decode (Granite 4.0-H, Nemotron-H): one token of a batch through the SSD recurrence, the states read and
 * written in place at their slots of one layer's state pool. The causal convolution before it is
 * gdn_conv_update's (gated_deltanet.c, with the conv bias); the gated RMSNorm and the projections stay in torch.
 *
 * mamba2_decode_{f32,bf16}: xbc [B, *] float32 (row stride xs): the convolved x [H, P], B [G, Nst], C [G, Nst]
 *   channels; dt [B, H] (row stride ds) and dt_bias [H] raw, in the entry's dtype; A [H] (= -exp(A_log)) and
 *   D [H] float32; state [N, H, P, Nst] float32; head h reads group h / (H / G). Per (row b, head h),
 *   S = state[slots[b], h]:
 *     dt <- softplus(dt + dt_bias) (x past 20: x; the bf16 entry rounds the sum and the softplus to bf16 as
 *     torch's bf16 add and softplus do), dA = exp(dt A);
 *     S[p] <- dA S[p] + x[p] (dt B);  out[b, h, p] = S[p] . C + D x[p]  (out [B, H, P] float32).
 *   One pass over S per head, each row of Nst lanes as AVX-512 (16 lanes, masked tail), AVX2 + FMA (8 lanes,
 *   scalar tail) or plain C, chosen by the target flags. Threads split the (row, head) pairs.
 *   Limits: Nst <= 1024, H a multiple of G. Returns 0; -1 on a slot outside [0, N) or a shape outside the limits.
 */
#include "common.h"
#include "kernels.h"

#define M2_MAX_N 1024

/* row[j] = d row[j] + xp dtb[j]; returns sum_j row[j] c[j] */
static inline float m2_row(float *row, float d, float xp, const float *dtb, const float *c, int64_t n) {
    int64_t j = 0;
    float tail = 0.0f;
#if defined(__AVX512F__)
    const __m512 vd = _mm512_set1_ps(d), vx = _mm512_set1_ps(xp);
    __m512 acc = _mm512_setzero_ps();
    for (; j + 16 <= n; j += 16) {
        __m512 r = _mm512_fmadd_ps(vx, _mm512_loadu_ps(dtb + j), _mm512_mul_ps(_mm512_loadu_ps(row + j), vd));
        _mm512_storeu_ps(row + j, r);
        acc = _mm512_fmadd_ps(r, _mm512_loadu_ps(c + j), acc);
    }
    if (j < n) {
        __mmask16 m = (__mmask16)((1u << (n - j)) - 1u);
        __m512 r = _mm512_fmadd_ps(vx, _mm512_maskz_loadu_ps(m, dtb + j),
                                   _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), vd));
        _mm512_mask_storeu_ps(row + j, m, r);
        acc = _mm512_fmadd_ps(r, _mm512_maskz_loadu_ps(m, c + j), acc);
        j = n;
    }
    tail = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__)
    const __m256 vd = _mm256_set1_ps(d), vx = _mm256_set1_ps(xp);
    __m256 acc = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        __m256 r = _mm256_fmadd_ps(vx, _mm256_loadu_ps(dtb + j), _mm256_mul_ps(_mm256_loadu_ps(row + j), vd));
        _mm256_storeu_ps(row + j, r);
        acc = _mm256_fmadd_ps(r, _mm256_loadu_ps(c + j), acc);
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    tail = _mm_cvtss_f32(h);
#endif
    for (; j < n; j++) {
        row[j] = row[j] * d + xp * dtb[j];
        tail += row[j] * c[j];
    }
    return tail;
}

/* one (row, head): S [P, Nst] updated in place, y [P] written */
static void m2_head(float *S, const float *x, const float *Bg, const float *Cg, float dt, float dA, float Dh,
                    int64_t P, int64_t Nst, float *y) {
    float dtb[M2_MAX_N];
    for (int64_t j = 0; j < Nst; j++) dtb[j] = dt * Bg[j];
    for (int64_t p = 0; p < P; p++) y[p] = m2_row(S + p * Nst, dA, x[p], dtb, Cg, Nst) + x[p] * Dh;
}

static inline float m2_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static int m2_decode(const float *xbc, int64_t xs, const void *dt, int64_t ds, const void *dt_bias, const float *A,
                     const float *D, float *state, const int64_t *slots, int64_t B, int64_t H, int64_t P, int64_t G,
                     int64_t Nst, int64_t N, int bf16, float *out) {
    if (P <= 0 || Nst <= 0 || Nst > M2_MAX_N || G <= 0 || H % G != 0) return -1;
    for (int64_t b = 0; b < B; b++)
        if (slots[b] < 0 || slots[b] >= N) return -1;
    const int64_t rep = H / G, head = P * Nst;
#pragma omp parallel for schedule(static) if (B * H * head >= (1 << 16))
    for (int64_t t = 0; t < B * H; t++) {
        int64_t b = t / H, h = t % H, g = h / rep;
        const float *row = xbc + b * xs;
        float v;
        if (bf16) {
            v = bf16_to_f32(f32_to_bf16(bf16_to_f32(((const uint16_t *)dt)[b * ds + h]) +
                                        bf16_to_f32(((const uint16_t *)dt_bias)[h])));
            v = bf16_to_f32(f32_to_bf16(m2_softplus(v)));
        } else {
            v = m2_softplus(((const float *)dt)[b * ds + h] + ((const float *)dt_bias)[h]);
        }
        m2_head(state + (slots[b] * H + h) * head, row + h * P, row + H * P + g * Nst, row + H * P + (G + g) * Nst, v,
                expf(v * A[h]), D[h], P, Nst, out + t * P);
    }
    return 0;
}

int mamba2_decode_f32(const float *xbc, int64_t xs, const float *dt, int64_t ds, const float *dt_bias, const float *A,
                      const float *D, float *state, const int64_t *slots, int64_t B, int64_t H, int64_t P, int64_t G,
                      int64_t Nst, int64_t N, float *out) {
    return m2_decode(xbc, xs, dt, ds, dt_bias, A, D, state, slots, B, H, P, G, Nst, N, 0, out);
}

int mamba2_decode_bf16(const float *xbc, int64_t xs, const uint16_t *dt, int64_t ds, const uint16_t *dt_bias,
                       const float *A, const float *D, float *state, const int64_t *slots, int64_t B, int64_t H,
                       int64_t P, int64_t G, int64_t Nst, int64_t N, float *out) {
    return m2_decode(xbc, xs, dt, ds, dt_bias, A, D, state, slots, B, H, P, G, Nst, N, 1, out);
}
