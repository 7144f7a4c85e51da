/* The library's entry points that other kernels of it call (decode_layer.c), declared once: every
 * defining file includes this header too, so a signature that drifts fails to compile. */
#ifndef RADIXLANG_CPU_KERNELS_H
#define RADIXLANG_CPU_KERNELS_H
#include <stdint.h>

int dense_gemv_bf16(const uint16_t *x, int64_t xs, const uint16_t *wt, const uint16_t *bias, uint16_t *out,
                    int64_t M, int64_t K, int64_t N);
int dense_gemv_f32(const float *x, int64_t xs, const float *wt, const float *bias, float *out, int64_t M, int64_t K,
                   int64_t N);
int gguf_gemv_bf16(const uint16_t *x, const uint8_t *w, int64_t fmt, uint16_t *out, int64_t M, int64_t K, int64_t N);
int gguf_gemv_f32(const float *x, const uint8_t *w, int64_t fmt, float *out, int64_t M, int64_t K, int64_t N);
int int8_q8_gemv(const void *x, int x_bf16, const uint8_t *tiles, const float *scale, void *out, int out_bf16,
                 int64_t M, int64_t K, int64_t N);
int gguf_q8_gemv(const void *x, int x_bf16, const uint8_t *tiles, int64_t fmt, void *out, int out_bf16, int64_t M,
                 int64_t K, int64_t N);
int qlinear_int8_bf16(const uint16_t *x, const int8_t *w, const float *scale, uint16_t *out, int64_t M, int64_t K,
                      int64_t N);
int qlinear_int8_f32(const float *x, const int8_t *w, const float *scale, float *out, int64_t M, int64_t K, int64_t N);
void add_rms_norm_bf16(uint16_t *residual, const uint16_t *x, const uint16_t *weight, uint16_t *out, int64_t T,
                       int64_t H, float eps);
void add_rms_norm_f32(float *residual, const float *x, const float *weight, float *out, int64_t T, int64_t H,
                      float eps);
void silu_mul_bf16(const uint16_t *gu, uint16_t *out, int64_t T, int64_t I);
void silu_mul_f32(const float *gu, float *out, int64_t T, int64_t I);
int paged_decode_bf16(const uint16_t *q, const uint16_t *k_pool, const uint16_t *v_pool, const int64_t *req_to_token,
                      const int64_t *req_rows, const int64_t *seq_lens, const int64_t *k_begin,
                      const uint16_t *prior_o, const float *prior_lse, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                      int64_t N, int64_t ctx, float scale, uint16_t *out);
int paged_decode_f32(const float *q, const float *k_pool, const float *v_pool, const int64_t *req_to_token,
                     const int64_t *req_rows, const int64_t *seq_lens, const int64_t *k_begin, const float *prior_o,
                     const float *prior_lse, int64_t B, int64_t H, int64_t Hkv, int64_t D, int64_t N, int64_t ctx,
                     float scale, float *out);
/* extend attention (extend_attention.c: VDPBF16PS, -1 on other builds; extend_impl.h: portable) */
#define EXTEND_ARGS(T)                                                                                              \
    const T *q, int64_t q_stride, const T *k, int64_t k_stride, const T *v, int64_t v_stride, const int64_t *starts, \
        const int64_t *lens, int64_t R, int64_t H, int64_t Hkv, int64_t D, float scale, T *out, const T *k_pool,    \
        const T *v_pool, int64_t N, const int64_t *req_to_token, int64_t rt_stride, const int64_t *req_rows,        \
        const int64_t *prefix_lens, const int64_t *k_begin, const int64_t *q_index, float *lse_out,              \
        const T *prior_o, const float *prior_lse, int64_t window
int extend_causal_bf16(EXTEND_ARGS(uint16_t));
int extend_causal_portable_bf16(EXTEND_ARGS(uint16_t));
int extend_causal_f32(EXTEND_ARGS(float));
#undef EXTEND_ARGS
void rope_store_bf16(uint16_t *qkv, int64_t T, int64_t row_stride, int64_t H, int64_t Hkv, int64_t D,
                     const uint16_t *cos, const uint16_t *sin, const int64_t *out_loc, uint16_t *k_pool,
                     uint16_t *v_pool, int64_t N);
void rope_store_f32(float *qkv, int64_t T, int64_t row_stride, int64_t H, int64_t Hkv, int64_t D, const float *cos,
                    const float *sin, const int64_t *out_loc, float *k_pool, float *v_pool, int64_t N);

#endif
