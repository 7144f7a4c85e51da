/*
 * Gated DeltaNet decode (Qwen3-Next, Qwen3.5 linear-attention layers): one token of a batch, the recurrent states
 * read and written in place at their slots of one layer's state pool.
 *
 * gdn_conv_update_{f32,bf16}: the causal depthwise convolution of width K over the new row (the Mamba2 mixer's
 *   too). x [B, C] (row stride xs), conv [N, C, K - 1] (per slot the last K - 1 inputs, oldest first), w [C, K],
 *   bias [C] or NULL, slots [B] int64 -> out [B, C] float32 = silu(w[c] . (conv[slot, c], x[b, c]) + bias[c]),
 *   and conv[slot] shifted by one with x[b] appended. The bf16 entry rounds the biased sum and the SiLU to bf16
 *   as torch's bf16 conv1d and silu do.
 * gdn_decode_f32: the gated delta rule. qkv [B, *] float32 (row stride qs): the convolved q [Hk, Dk], k [Hk, Dk],
 *   v [Hv, Dv] channels; g, beta [B, Hv] float32; state [N, Hv, Dk, Dv] float32; value head h reads key head
 *   h / (Hv / Hk). Per (row b, head h), S = state[slots[b], h]:
 *     q, k <- l2norm (x / sqrt(sum x^2 + 1e-6)), q <- q / sqrt(Dk);
 *     S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  out[b, h] = S^T q  (out [B, Hv, Dv] float32).
 *   Two passes over S per head (decay with S^T k; the update with S^T q), each row of Dv lanes as AVX-512
 *   (16 lanes, masked tail), AVX2 + FMA (8 lanes, scalar tail) or plain C, chosen by the target flags.
 *   Threads split the (row, head) pairs. Limits: Dk, Dv <= 1024, Hv a multiple of Hk.
 * gdn_prefill_f32: the same rule token after token over segments of rows (segment r: rows starts[r] ..
 *   starts[r] + lens[r] - 1 from state slot slots[r]; g, beta [T, Hv]; out [T, Hv, Dv]): the recurrent form for
 *   extends, each head's S kept in cache across the segment's tokens. Threads split the (segment, head) pairs.
 * gdn_conv_prefill_{f32,bf16}: gdn_conv_update's arithmetic token after token over segments (as gdn_prefill's),
 *   each segment's window read from and written back to its slot: a token's output is the same bits whichever
 *   of the two computes it (what --enable-deterministic-inference needs).
 * gdn_gates_f32: g = -exp(A_log[h]) softplus(a + dt_bias[h]) (softplus(x) = x past 20), beta = sigmoid(b), per
 *   element of [T, H]; gdn_gated_norm_f32: out [R, D] = w * rms_norm(x) * silu(z) per row; sigmoid_mul_f32: x *=
 *   sigmoid(gate) per element (the gated attention's output gate). Scalar math, one element or row at a time.
 * The int ones return 0; -1 on a slot outside [0, N) or a shape outside the limits.
 */
#include "common.h"
#include "kernels.h"

#define GDN_MAX_D 1024

/* row[j] *= d; acc[j] += ki * row[j] */
static inline void gdn_decay_dot(float *row, float d, float ki, float *acc, int64_t n) {
    int64_t j = 0;
#if defined(__AVX512F__)
    const __m512 vd = _mm512_set1_ps(d), vk = _mm512_set1_ps(ki);
    for (; j + 16 <= n; j += 16) {
        __m512 r = _mm512_mul_ps(_mm512_loadu_ps(row + j), vd);
        _mm512_storeu_ps(row + j, r);
        _mm512_storeu_ps(acc + j, _mm512_fmadd_ps(vk, r, _mm512_loadu_ps(acc + j)));
    }
    if (j < n) {
        __mmask16 m = (__mmask16)((1u << (n - j)) - 1u);
        __m512 r = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), vd);
        _mm512_mask_storeu_ps(row + j, m, r);
        _mm512_mask_storeu_ps(acc + j, m, _mm512_fmadd_ps(vk, r, _mm512_maskz_loadu_ps(m, acc + j)));
        return;
    }
#elif defined(__AVX2__)
    const __m256 vd = _mm256_set1_ps(d), vk = _mm256_set1_ps(ki);
    for (; j + 8 <= n; j += 8) {
        __m256 r = _mm256_mul_ps(_mm256_loadu_ps(row + j), vd);
        _mm256_storeu_ps(row + j, r);
        _mm256_storeu_ps(acc + j, _mm256_fmadd_ps(vk, r, _mm256_loadu_ps(acc + j)));
    }
#endif
    for (; j < n; j++) {
        row[j] *= d;
        acc[j] += ki * row[j];
    }
}

/* row[j] += ki * delta[j]; acc[j] += qi * row[j] */
static inline void gdn_update_dot(float *row, const float *delta, float ki, float qi, float *acc, int64_t n) {
    int64_t j = 0;
#if defined(__AVX512F__)
    const __m512 vk = _mm512_set1_ps(ki), vq = _mm512_set1_ps(qi);
    for (; j + 16 <= n; j += 16) {
        __m512 r = _mm512_fmadd_ps(vk, _mm512_loadu_ps(delta + j), _mm512_loadu_ps(row + j));
        _mm512_storeu_ps(row + j, r);
        _mm512_storeu_ps(acc + j, _mm512_fmadd_ps(vq, r, _mm512_loadu_ps(acc + j)));
    }
    if (j < n) {
        __mmask16 m = (__mmask16)((1u << (n - j)) - 1u);
        __m512 r = _mm512_fmadd_ps(vk, _mm512_maskz_loadu_ps(m, delta + j), _mm512_maskz_loadu_ps(m, row + j));
        _mm512_mask_storeu_ps(row + j, m, r);
        _mm512_mask_storeu_ps(acc + j, m, _mm512_fmadd_ps(vq, r, _mm512_maskz_loadu_ps(m, acc + j)));
        return;
    }
#elif defined(__AVX2__)
    const __m256 vk = _mm256_set1_ps(ki), vq = _mm256_set1_ps(qi);
    for (; j + 8 <= n; j += 8) {
        __m256 r = _mm256_fmadd_ps(vk, _mm256_loadu_ps(delta + j), _mm256_loadu_ps(row + j));
        _mm256_storeu_ps(row + j, r);
        _mm256_storeu_ps(acc + j, _mm256_fmadd_ps(vq, r, _mm256_loadu_ps(acc + j)));
    }
#endif
    for (; j < n; j++) {
        row[j] += ki * delta[j];
        acc[j] += qi * row[j];
    }
}

/* dst = x / sqrt(sum x^2 + 1e-6) (transformers' l2norm), then / div */
static void gdn_l2norm(const float *x, float *dst, int64_t n, float div) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss + 1e-6f);
    for (int64_t i = 0; i < n; i++) dst[i] = x[i] * r / div;
}

/* one (row, head): S [Dk, Dv] updated in place, o [Dv] written */
static void gdn_head(float *S, const float *q, const float *k, const float *v, float g, float beta, int64_t Dk,
                     int64_t Dv, float *o) {
    float qn[GDN_MAX_D], kn[GDN_MAX_D], acc[GDN_MAX_D], delta[GDN_MAX_D];
    gdn_l2norm(q, qn, Dk, sqrtf((float)Dk));
    gdn_l2norm(k, kn, Dk, 1.0f);
    const float decay = expf(g);
    memset(acc, 0, (size_t)Dv * sizeof(float));
    for (int64_t i = 0; i < Dk; i++) gdn_decay_dot(S + i * Dv, decay, kn[i], acc, Dv);
    for (int64_t j = 0; j < Dv; j++) delta[j] = (v[j] - acc[j]) * beta;
    memset(o, 0, (size_t)Dv * sizeof(float));
    for (int64_t i = 0; i < Dk; i++) gdn_update_dot(S + i * Dv, delta, kn[i], qn[i], o, Dv);
}

int gdn_decode_f32(const float *qkv, int64_t qs, const float *g, const float *beta, float *state,
                   const int64_t *slots, int64_t B, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, int64_t N,
                   float *out) {
    if (Dk <= 0 || Dv <= 0 || Dk > GDN_MAX_D || Dv > GDN_MAX_D || Hk <= 0 || Hv % Hk != 0) return -1;
    for (int64_t b = 0; b < B; b++)
        if (slots[b] < 0 || slots[b] >= N) return -1;
    const int64_t rep = Hv / Hk, head = Dk * Dv;
#pragma omp parallel for schedule(static) if (B * Hv * head >= (1 << 16))
    for (int64_t t = 0; t < B * Hv; t++) {
        int64_t b = t / Hv, h = t % Hv, hk = h / rep;
        const float *row = qkv + b * qs;
        gdn_head(state + (slots[b] * Hv + h) * head, row + hk * Dk, row + (Hk + hk) * Dk, row + 2 * Hk * Dk + h * Dv,
                 g[t], beta[t], Dk, Dv, out + t * Dv);
    }
    return 0;
}

int gdn_prefill_f32(const float *qkv, int64_t qs, const float *g, const float *beta, float *state,
                    const int64_t *slots, const int64_t *starts, const int64_t *lens, int64_t R, int64_t Hk,
                    int64_t Hv, int64_t Dk, int64_t Dv, int64_t N, float *out) {
    if (Dk <= 0 || Dv <= 0 || Dk > GDN_MAX_D || Dv > GDN_MAX_D || Hk <= 0 || Hv % Hk != 0) return -1;
    for (int64_t r = 0; r < R; r++)
        if (slots[r] < 0 || slots[r] >= N || starts[r] < 0 || lens[r] < 0) return -1;
    const int64_t rep = Hv / Hk, head = Dk * Dv;
#pragma omp parallel for schedule(dynamic) if (R * Hv > 1)
    for (int64_t t = 0; t < R * Hv; t++) {
        int64_t r = t / Hv, h = t % Hv, hk = h / rep;
        float *S = state + (slots[r] * Hv + h) * head;
        for (int64_t i = starts[r]; i < starts[r] + lens[r]; i++) {
            const float *row = qkv + i * qs;
            gdn_head(S, row + hk * Dk, row + (Hk + hk) * Dk, row + 2 * Hk * Dk + h * Dv, g[i * Hv + h],
                     beta[i * Hv + h], Dk, Dv, out + (i * Hv + h) * Dv);
        }
    }
    return 0;
}

static inline float gdn_silu(float y) { return y / (1.0f + expf(-y)); }

static inline float gdn_at(const void *p, int64_t i, int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* one channel's output over its window win [K] (oldest first): decode and prefill share it, so a token's
 * output does not depend on which of them computed it */
static inline float gdn_conv_dot(const float *win, const void *w, const void *bias, int64_t c, int64_t K, int bf16) {
    float y = 0.0f;
    for (int64_t i = 0; i < K; i++) y += gdn_at(w, c * K + i, bf16) * win[i];
    if (bias) y += gdn_at(bias, c, bf16);
    return bf16 ? bf16_to_f32(f32_to_bf16(gdn_silu(bf16_to_f32(f32_to_bf16(y))))) : gdn_silu(y);
}

static inline void gdn_window_store(void *conv, int64_t s, const float *win, int64_t W, int bf16) {
    for (int64_t i = 0; i < W; i++) {
        if (bf16)
            ((uint16_t *)conv)[s + i] = f32_to_bf16(win[i]);
        else
            ((float *)conv)[s + i] = win[i];
    }
}

static int gdn_conv(const void *x, int64_t xs, void *conv, const void *w, const void *bias, const int64_t *slots,
                    int64_t B, int64_t C, int64_t K, int64_t N, int bf16, float *out) {
    if (K < 2 || K > 16) return -1;
    for (int64_t b = 0; b < B; b++)
        if (slots[b] < 0 || slots[b] >= N) return -1;
    const int64_t W = K - 1;
#pragma omp parallel for schedule(static) if (B * C >= (1 << 14))
    for (int64_t t = 0; t < B * C; t++) {
        int64_t b = t / C, c = t % C, s = (slots[b] * C + c) * W;
        float win[16];
        for (int64_t i = 0; i < W; i++) win[i] = gdn_at(conv, s + i, bf16);
        win[W] = gdn_at(x, b * xs + c, bf16);
        out[t] = gdn_conv_dot(win, w, bias, c, K, bf16);
        gdn_window_store(conv, s, win + 1, W, bf16);
    }
    return 0;
}

/* the same convolution token after token over segments (segment r: rows starts[r] .. starts[r] + lens[r] - 1
 * of x from slot slots[r]'s window, which ends holding the segment's last K - 1 inputs) */
static int gdn_conv_segments(const void *x, int64_t xs, void *conv, const void *w, const int64_t *slots,
                             const int64_t *starts, const int64_t *lens, int64_t R, int64_t C, int64_t K, int64_t N,
                             int bf16, float *out) {
    if (K < 2 || K > 16) return -1;
    for (int64_t r = 0; r < R; r++)
        if (slots[r] < 0 || slots[r] >= N || starts[r] < 0 || lens[r] < 0) return -1;
    const int64_t W = K - 1;
#pragma omp parallel for schedule(static) if (R * C >= 64)
    for (int64_t t = 0; t < R * C; t++) {
        int64_t r = t / C, c = t % C, s = (slots[r] * C + c) * W;
        float win[16];
        for (int64_t i = 0; i < W; i++) win[i] = gdn_at(conv, s + i, bf16);
        for (int64_t i = starts[r]; i < starts[r] + lens[r]; i++) {
            win[W] = gdn_at(x, i * xs + c, bf16);
            out[i * C + c] = gdn_conv_dot(win, w, NULL, c, K, bf16);
            for (int64_t j = 0; j < W; j++) win[j] = win[j + 1];
        }
        gdn_window_store(conv, s, win, W, bf16);
    }
    return 0;
}

int gdn_conv_prefill_f32(const float *x, int64_t xs, float *conv, const float *w, const int64_t *slots,
                         const int64_t *starts, const int64_t *lens, int64_t R, int64_t C, int64_t K, int64_t N,
                         float *out) {
    return gdn_conv_segments(x, xs, conv, w, slots, starts, lens, R, C, K, N, 0, out);
}

int gdn_conv_prefill_bf16(const uint16_t *x, int64_t xs, uint16_t *conv, const uint16_t *w, const int64_t *slots,
                          const int64_t *starts, const int64_t *lens, int64_t R, int64_t C, int64_t K, int64_t N,
                          float *out) {
    return gdn_conv_segments(x, xs, conv, w, slots, starts, lens, R, C, K, N, 1, out);
}

void gdn_gates_f32(const float *a, const float *b, const float *A_log, const float *dt_bias, int64_t T, int64_t H,
                   float *g, float *beta) {
#pragma omp parallel for schedule(static) if (T * H >= (1 << 14))
    for (int64_t t = 0; t < T * H; t++) {
        int64_t h = t % H;
        float x = a[t] + dt_bias[h];
        float sp = x > 20.0f ? x : log1pf(expf(x));
        g[t] = -expf(A_log[h]) * sp;
        beta[t] = 1.0f / (1.0f + expf(-b[t]));
    }
}

void gdn_gated_norm_f32(const float *x, const float *z, const float *w, int64_t R, int64_t D, float eps,
                        float *out) {
#pragma omp parallel for schedule(static) if (R * D >= (1 << 14))
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * D, *zr = z + r * D;
        float ss = 0.0f;
        for (int64_t i = 0; i < D; i++) ss += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(ss / (float)D + eps);
        for (int64_t i = 0; i < D; i++) out[r * D + i] = w[i] * (xr[i] * inv) * gdn_silu(zr[i]);
    }
}

void sigmoid_mul_f32(float *x, const float *gate, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * (1.0f / (1.0f + expf(-gate[i])));
}

int gdn_conv_update_f32(const float *x, int64_t xs, float *conv, const float *w, const float *bias,
                        const int64_t *slots, int64_t B, int64_t C, int64_t K, int64_t N, float *out) {
    return gdn_conv(x, xs, conv, w, bias, slots, B, C, K, N, 0, out);
}

int gdn_conv_update_bf16(const uint16_t *x, int64_t xs, uint16_t *conv, const uint16_t *w, const uint16_t *bias,
                         const int64_t *slots, int64_t B, int64_t C, int64_t K, int64_t N, float *out) {
    return gdn_conv(x, xs, conv, w, bias, slots, B, C, K, N, 1, out);
}
