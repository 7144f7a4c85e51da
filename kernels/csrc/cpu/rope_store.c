/*
 * Neox rotary embedding in place on the q and k heads of a step's qkv rows, then each row's k and v heads
 * into the KV pool (rope_store_bf16 / rope_store_f32): what Rotary.apply + KVPool.store do in ~6 torch
 * ops per layer, the pool's index_copy_ along dim 1 a large part of their time
 * (docs/PERFORMANCE.md#rope-and-kv-store).
 *
 *   qkv     [T, (H + 2 Hkv) D]  q heads, k heads, v heads per row (row stride row_stride elements)
 *   cos     [T, D], sin [T, D / 2]  the rows' positions' tables (Rotary.cos_sin), element type as qkv
 *           (both NULL: no rotary, a NoPE layer's store only)
 *   out_loc [T] pool slot of each row; k_pool, v_pool [Hkv, N, D] (all three NULL: rope only)
 *
 * Invariant: the result is bit-identical to Rotary.apply: x * cos rounded to the element type, then the
 * rotated half's product added by one fused multiply-add (torch's CPU addcmul_ in float32; for bf16
 * the product of two bf16 values is exact, so fused or not is the same) and rounded again; nothing else
 * is contracted (fp-contract off). Rows are independent: spread over OpenMP threads for large T.
 */
#include "common.h"
#include "kernels.h"

#define ROPE_BODY(ELEM, TO_F32, FROM_F32, RND)                                                                 \
    const int64_t h = D / 2, el = (int64_t)sizeof(ELEM);                                                    \
    _Pragma("omp parallel for schedule(static) if (T >= 64)") for (int64_t t = 0; t < T; t++) {             \
        ELEM *row = qkv + t * row_stride;                                                                   \
        const ELEM *c = cos ? cos + t * D : NULL, *s = sin ? sin + t * h : NULL;                            \
        for (int64_t hd = 0; hd < (c ? H + Hkv : 0); hd++) {                                                \
            ELEM *p = row + hd * D;                                                                         \
            for (int64_t i = 0; i < h; i++) {                                                               \
                const float x1 = TO_F32(p[i]), x2 = TO_F32(p[h + i]), si = TO_F32(s[i]);                    \
                const float o1 = RND(x1 * TO_F32(c[i])), o2 = RND(x2 * TO_F32(c[h + i]));                   \
                p[i] = FROM_F32(fmaf(-x2, si, o1));                                                         \
                p[h + i] = FROM_F32(fmaf(x1, si, o2));                                                      \
            }                                                                                               \
        }                                                                                                   \
        if (out_loc)                                                                                        \
            for (int64_t g = 0; g < Hkv; g++) {                                                             \
                memcpy(k_pool + (g * N + out_loc[t]) * D, row + (H + g) * D, (size_t)(D * el));             \
                memcpy(v_pool + (g * N + out_loc[t]) * D, row + (H + Hkv + g) * D, (size_t)(D * el));       \
            }                                                                                               \
    }

static inline float f32_same(float x) { return x; }
static inline float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

__attribute__((optimize("fp-contract=off"))) void rope_store_bf16(uint16_t *qkv, int64_t T, int64_t row_stride,
                                                                  int64_t H, int64_t Hkv, int64_t D,
                                                                  const uint16_t *cos, const uint16_t *sin,
                                                                  const int64_t *out_loc, uint16_t *k_pool,
                                                                  uint16_t *v_pool, int64_t N) {
    ROPE_BODY(uint16_t, bf16_to_f32, f32_to_bf16, bf16_round)
}

__attribute__((optimize("fp-contract=off"))) void rope_store_f32(float *qkv, int64_t T, int64_t row_stride, int64_t H,
                                                                 int64_t Hkv, int64_t D, const float *cos,
                                                                 const float *sin, const int64_t *out_loc,
                                                                 float *k_pool, float *v_pool, int64_t N) {
    ROPE_BODY(float, f32_same, f32_same, f32_same)
}
#undef ROPE_BODY
