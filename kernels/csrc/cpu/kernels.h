/* Every entry point of the CPU kernel library, declared once. The defining files include this header, so a
 * definition that drifts from its declaration fails to compile; radixlang_kernels/header.py parses it at load
 * to type the ctypes calls (the op table), so Python never restates a signature.
 *
 * The parser reads a strict subset of C, and refuses by name anything else: `typedef struct { ... } name;`
 * with fields of the types below, and prototypes `int|void name(params);` whose parameters are void,
 * int, int64_t, float, a pointer to any of (const) void / uint8_t / int8_t / uint16_t / int64_t / float, a
 * pointer to a struct declared here, or a pointer to pointers. No macros, arrays or function pointers.
 * bf16 tensors travel as uint16_t. Return codes: 0 done, -1 the shapes are outside the kernel's limits
 * (the planner never passes such a batch), -2 out of memory. */
#ifndef RADIXLANG_CPU_KERNELS_H
#define RADIXLANG_CPU_KERNELS_H
#include <stdint.h>

/* decode_layer.c: a linear's weights. kind 0 dense tiles (gemv_dense.c; bias applied inside), 1 GGUF blocks
 * of format fmt, 2 int8 rows with per-row scale, 3 GGUF blocks of format fmt as gemv_q8.c's tiles, 4 int8
 * rows as gemv_q8.c's tiles with per-row scale, 5 parts side by side (w: decode_linear [fmt], each writing
 * its columns; the bias is the whole linear's), 6 GGUF blocks of ggml type fmt with int8 activations
 * (gemv_kquant.c), 7 the same with float32 sums over the exact values (gguf_dequant.c). */
typedef struct {
    int64_t kind, fmt, N, K;
    const void *w;
    const float *scale;
    const void *bias; /* [N] like x, or NULL */
} decode_linear;

/* decode_layer.c: one decoder layer's weights */
typedef struct {
    decode_linear qkv, o, gate_up, down;
    const void *in_norm, *post_norm; /* [hidden] like x */
    int64_t layer;                   /* index into the step's pools */
    int64_t window;                  /* sliding window > 0: attend from the step's win_begin, no groups */
    int64_t nope;                    /* 1: a NoPE layer (no rotary on q and k; the K/V store only) */
} decode_layer_weights;

/* decode_layer.c: what every layer of one decode step shares */
typedef struct {
    int64_t M, hidden, H, Hkv, D, inter, slots, ctx;
    float eps, scale;
    const void *cos, *sin;                                       /* [M, D], [M, D / 2] like x */
    const int64_t *out_loc, *req_to_token, *req_rows, *seq_lens; /* [M], [rows, ctx], [M], [M] */
    void *const *k_pools, *const *v_pools;                       /* per layer [Hkv, slots, D] */
    /* cascade groups (attention/cascade.py's CascadePlan; groups == 0 and every pointer NULL: none):
     * [G], [G], [E], [G + 1], [G], [M] */
    int64_t groups, dpbf16;
    const int64_t *group_rows, *group_lens, *q_index, *group_starts, *group_counts, *k_begin;
    void *prior_o;            /* [M, H, D] like x: each layer's shared parts (rows not in a group keep lse -inf) */
    float *prior_lse;         /* [M, H] */
    const int64_t *win_begin; /* [M] max(0, seq_len - window) for the windowed layers (NULL: none) */
} decode_step;

/* gemv_dense.c: x [M, K] (row stride xs) @ dense tiles (+ bias [N] or NULL) -> out [M, N] */
int dense_gemv_bf16(const uint16_t *x, int64_t xs, const uint16_t *wt, const uint16_t *bias, uint16_t *out,
                    int64_t M, int64_t K, int64_t N);
int dense_gemv_portable_bf16(const uint16_t *x, int64_t xs, const uint16_t *wt, const uint16_t *bias,
                             uint16_t *out, int64_t M, int64_t K, int64_t N);
int dense_gemv_f32(const float *x, int64_t xs, const float *wt, const float *bias, float *out, int64_t M, int64_t K,
                   int64_t N);
/* gemv_dense.c: 1 where dense_gemv_<dtype> takes any M on this build, else 0 (M <= DENSE_MAX_M) */
int dense_any_m_bf16(void);
int dense_any_m_f32(void);

/* gemv.c: x [M, K] @ GGUF Q4_1 / Q8_0 blocks (fmt: ggml type number), or int8 rows * scale [N] */
int gguf_gemv_bf16(const uint16_t *x, const uint8_t *w, int64_t fmt, uint16_t *out, int64_t M, int64_t K, int64_t N);
int gguf_gemv_f32(const float *x, const uint8_t *w, int64_t fmt, float *out, int64_t M, int64_t K, int64_t N);
int qlinear_int8_bf16(const uint16_t *x, const int8_t *w, const float *scale, uint16_t *out, int64_t M, int64_t K,
                      int64_t N);
int qlinear_int8_f32(const float *x, const int8_t *w, const float *scale, float *out, int64_t M, int64_t K, int64_t N);

/* gemv_q8.c: x (bf16 or float32, x_bf16) quantized per block of 32 @ int8 / GGUF tiles -> out (out_bf16) */
int int8_q8_gemv(const void *x, int x_bf16, const uint8_t *tiles, const float *scale, void *out, int out_bf16,
                 int64_t M, int64_t K, int64_t N);
int gguf_q8_gemv(const void *x, int x_bf16, const uint8_t *tiles, int64_t fmt, void *out, int out_bf16, int64_t M,
                 int64_t K, int64_t N);

/* gemv_kquant.c: x (bf16 or float32) quantized to int8 per block (q8_K / q8_0) @ the file's rows of GGUF blocks
 * of ggml type `type` (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS) -> out, M <= 256 */
int gguf_kq_gemv(const void *x, int x_bf16, const uint8_t *w, int64_t type, void *out, int out_bf16, int64_t M,
                 int64_t K, int64_t N);
/* gemm_kquant.c: the same int8-activation sums for any number of rows (each weight unpacked once per call, register
 * tiles of rows x weight rows) -> out [M, ldo] (columns 0 .. N) */
int gguf_kq_gemm(const void *x, int x_bf16, const uint8_t *w, int64_t type, void *out, int out_bf16, int64_t M,
                 int64_t K, int64_t N, int64_t ldo);
/* gemm_kquant.c: the same on gemv_q8.c's tiles (activations per block of 32, as gemv_q8.c quantizes them) */
int gguf_q8_tiles_gemm(const void *x, int x_bf16, const uint8_t *tiles, int64_t fmt, void *out, int out_bf16,
                       int64_t M, int64_t K, int64_t N, int64_t ldo);
/* gguf_dequant.c: rows (NULL: row0 ..) of such blocks -> out [n_rows, K] bf16 / float32, gguf.quants' values */
int gguf_dequant_rows(const uint8_t *w, int64_t type, int64_t K, const int64_t *rows, int64_t row0, int64_t n_rows,
                      void *out, int out_bf16);
/* gguf_dequant.c: x @ those exact values.T in float32 sums (a float32 model's decode batches), M <= 256 */
int gguf_dequant_gemv(const void *x, int x_bf16, const uint8_t *w, int64_t type, void *out, int out_bf16, int64_t M,
                      int64_t K, int64_t N);

/* norm_act.c: residual [T, H] += x (x NULL: no add); out = rms_norm(residual) * weight; silu(gate) * up */
void add_rms_norm_bf16(uint16_t *residual, const uint16_t *x, const uint16_t *weight, uint16_t *out, int64_t T,
                       int64_t H, float eps);
void add_rms_norm_f32(float *residual, const float *x, const float *weight, float *out, int64_t T, int64_t H,
                      float eps);
void silu_mul_bf16(const uint16_t *gu, uint16_t *out, int64_t T, int64_t I);
void silu_mul_f32(const float *gu, float *out, int64_t T, int64_t I);

/* decode_attention.c: paged decode attention reading K/V in place */
int paged_decode_bf16(const uint16_t *q, const uint16_t *k_pool, const uint16_t *v_pool, const int64_t *req_to_token,
                      const int64_t *req_rows, const int64_t *seq_lens, const int64_t *k_begin,
                      const uint16_t *prior_o, const float *prior_lse, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                      int64_t N, int64_t ctx, float scale, uint16_t *out);
int paged_decode_f32(const float *q, const float *k_pool, const float *v_pool, const int64_t *req_to_token,
                     const int64_t *req_rows, const int64_t *seq_lens, const int64_t *k_begin, const float *prior_o,
                     const float *prior_lse, int64_t B, int64_t H, int64_t Hkv, int64_t D, int64_t N, int64_t ctx,
                     float scale, float *out);

/* mla_decode.c: multi-head latent attention decode (absorbed form) over one layer's latent entries in place */
int mla_decode_bf16(const uint16_t *q, const uint16_t *pool, const int64_t *req_to_token, const int64_t *req_rows,
                    const int64_t *seq_lens, int64_t B, int64_t H, int64_t C, int64_t R, int64_t N, int64_t ctx,
                    float scale, uint16_t *out);
int mla_decode_f32(const float *q, const float *pool, const int64_t *req_to_token, const int64_t *req_rows,
                   const int64_t *seq_lens, int64_t B, int64_t H, int64_t C, int64_t R, int64_t N, int64_t ctx,
                   float scale, float *out);

/* extend attention (extend_attention.c: VDPBF16PS, -1 on other builds; extend_impl.h: portable) */
int extend_causal_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *k, int64_t k_stride, const uint16_t *v,
                       int64_t v_stride, const int64_t *starts, const int64_t *lens, int64_t R, int64_t H, int64_t Hkv,
                       int64_t D, float scale, uint16_t *out, const uint16_t *k_pool, const uint16_t *v_pool, int64_t N,
                       const int64_t *req_to_token, int64_t rt_stride, const int64_t *req_rows,
                       const int64_t *prefix_lens, const int64_t *k_begin, const int64_t *q_index, float *lse_out,
                       const uint16_t *prior_o, const float *prior_lse, int64_t window);
int extend_causal_portable_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *k, int64_t k_stride,
                                const uint16_t *v, int64_t v_stride, const int64_t *starts, const int64_t *lens,
                                int64_t R, int64_t H, int64_t Hkv, int64_t D, float scale, uint16_t *out,
                                const uint16_t *k_pool, const uint16_t *v_pool, int64_t N, const int64_t *req_to_token,
                                int64_t rt_stride, const int64_t *req_rows, const int64_t *prefix_lens,
                                const int64_t *k_begin, const int64_t *q_index, float *lse_out,
                                const uint16_t *prior_o, const float *prior_lse, int64_t window);
int extend_causal_f32(const float *q, int64_t q_stride, const float *k, int64_t k_stride, const float *v,
                      int64_t v_stride, const int64_t *starts, const int64_t *lens, int64_t R, int64_t H, int64_t Hkv,
                      int64_t D, float scale, float *out, const float *k_pool, const float *v_pool, int64_t N,
                      const int64_t *req_to_token, int64_t rt_stride, const int64_t *req_rows,
                      const int64_t *prefix_lens, const int64_t *k_begin, const int64_t *q_index, float *lse_out,
                      const float *prior_o, const float *prior_lse, int64_t window);

/* gated_deltanet.c: Gated DeltaNet decode over one layer's state pool, states in place at their slots: the causal
 * conv update (out float32 = silu of the window's convolution) and the gated delta rule (qkv float32 rows), for
 * one row per request (decode) or token after token over segments of rows (prefill) */
int gdn_conv_update_f32(const float *x, int64_t xs, float *conv, const float *w, const float *bias,
                        const int64_t *slots, int64_t B, int64_t C, int64_t K, int64_t N, float *out);
int gdn_conv_update_bf16(const uint16_t *x, int64_t xs, uint16_t *conv, const uint16_t *w, const uint16_t *bias,
                         const int64_t *slots, int64_t B, int64_t C, int64_t K, int64_t N, float *out);
int gdn_decode_f32(const float *qkv, int64_t qs, const float *g, const float *beta, float *state,
                   const int64_t *slots, int64_t B, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, int64_t N,
                   float *out);
int gdn_prefill_f32(const float *qkv, int64_t qs, const float *g, const float *beta, float *state,
                    const int64_t *slots, const int64_t *starts, const int64_t *lens, int64_t R, int64_t Hk,
                    int64_t Hv, int64_t Dk, int64_t Dv, int64_t N, float *out);
/* gated_deltanet.c, batch-invariant pieces (--enable-deterministic-inference): the conv over segments as the
 * update computes it, the gates, the gated norm, the attention output gate */
int gdn_conv_prefill_f32(const float *x, int64_t xs, float *conv, const float *w, const int64_t *slots,
                         const int64_t *starts, const int64_t *lens, int64_t R, int64_t C, int64_t K, int64_t N,
                         float *out);
int gdn_conv_prefill_bf16(const uint16_t *x, int64_t xs, uint16_t *conv, const uint16_t *w, const int64_t *slots,
                          const int64_t *starts, const int64_t *lens, int64_t R, int64_t C, int64_t K, int64_t N,
                          float *out);
void gdn_gates_f32(const float *a, const float *b, const float *A_log, const float *dt_bias, int64_t T, int64_t H,
                   float *g, float *beta);
void gdn_gated_norm_f32(const float *x, const float *z, const float *w, int64_t R, int64_t D, float eps,
                        float *out);
void sigmoid_mul_f32(float *x, const float *gate, int64_t n);

/* mamba2.c: Mamba2 decode over one layer's state pool, states in place at their slots: dt's softplus, the SSD
 * recurrence and the D skip for one row per request (xbc: gdn_conv_update's float32 output; dt, dt_bias raw) */
int mamba2_decode_f32(const float *xbc, int64_t xs, const float *dt, int64_t ds, const float *dt_bias, const float *A,
                      const float *D, float *state, const int64_t *slots, int64_t B, int64_t H, int64_t P, int64_t G,
                      int64_t Nst, int64_t N, float *out);
int mamba2_decode_bf16(const float *xbc, int64_t xs, const uint16_t *dt, int64_t ds, const uint16_t *dt_bias,
                       const float *A, const float *D, float *state, const int64_t *slots, int64_t B, int64_t H,
                       int64_t P, int64_t G, int64_t Nst, int64_t N, float *out);

/* rope_store.c: neox rope on qkv's q and k heads in place, then (out_loc non-NULL) k and v into the pools */
void rope_store_bf16(uint16_t *qkv, int64_t T, int64_t row_stride, int64_t H, int64_t Hkv, int64_t D,
                     const uint16_t *cos, const uint16_t *sin, const int64_t *out_loc, uint16_t *k_pool,
                     uint16_t *v_pool, int64_t N);
void rope_store_f32(float *qkv, int64_t T, int64_t row_stride, int64_t H, int64_t Hkv, int64_t D, const float *cos,
                    const float *sin, const int64_t *out_loc, float *k_pool, float *v_pool, int64_t N);

/* decode_layer.c: one decoder layer of a decode-sized batch (h NULL on the first layer) */
int decode_layer_bf16(const decode_layer_weights *W, const decode_step *S, uint16_t *residual, const uint16_t *h,
                      uint16_t *out);
int decode_layer_f32(const decode_layer_weights *W, const decode_step *S, float *residual, const float *h,
                     float *out);

/* lora_sgmv.c: batched LoRA over row segments of the row list rows[] (seg_starts [S + 1]), t float32: shrink
 * t[j, 0:ranks[s]] = x[rows[j]] @ a[s]^T (a[s] [ranks[s], K]); expand, per task (tasks [NT, 5]: segment, column
 * in t, rank r, output offset, output width n), y[rows[j], off:off + n] += t[j, col:col + r] @ b[i] (b[i] [r, n]) */
int lora_shrink_f32(const float *x, int64_t xs, const int64_t *rows, const int64_t *seg_starts, int64_t S,
                    const float *const *a, const int64_t *ranks, int64_t K, float *t, int64_t ts);
int lora_expand_f32(const float *t, int64_t ts, const int64_t *rows, const int64_t *seg_starts, const int64_t *tasks,
                    int64_t NT, const float *const *b, float *y, int64_t ys);
int lora_shrink_bf16(const uint16_t *x, int64_t xs, const int64_t *rows, const int64_t *seg_starts, int64_t S,
                     const uint16_t *const *a, const int64_t *ranks, int64_t K, float *t, int64_t ts);
int lora_expand_bf16(const float *t, int64_t ts, const int64_t *rows, const int64_t *seg_starts,
                     const int64_t *tasks, int64_t NT, const uint16_t *const *b, uint16_t *y, int64_t ys);

#endif
