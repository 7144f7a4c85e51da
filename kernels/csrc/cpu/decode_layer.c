/*
 * One decoder layer of a decode-sized batch in a single call (decode_layer_bf16 / _f32): dispatching
 * the layer's ~15 torch ops and kernel calls one by one cost a large share of a one-stream decode step
 * once the weights stream at the memory's rate (docs/PERFORMANCE.md#fused-decode-layer).
 *
 *   x  = rms_norm(residual += h) * in_norm          (h == NULL on the first layer: no add)
 *   qkv = x @ Wqkv.T (+ bias);  q, k = rope(q, k);  K/V of each row -> the pool at out_loc[m]  (rope_store.c;
 *        a NoPE layer, W->nope: no rope, the store only)
 *   a  = paged_decode(q, pool, req_to_token, req_rows, seq_lens) @ Wo.T
 *        (with cascade groups: first the groups' shared parts by the extend kernel into the prior, then
 *        paged_decode over each request's own part from k_begin, merged with it: attention/cascade.py;
 *        a layer with a sliding window: paged_decode from win_begin, no groups)
 *   x2 = rms_norm(residual += a) * post_norm
 *   out = silu_mul(x2 @ Wgate_up.T) @ Wdown.T
 *
 * Invariant: the same kernels, in the same order, with the same rounding points as the module path
 * (llama.DecoderLayer with PackedLinear tiles / GGUFLinear / Int8Linear, the C norm and activation
 * kernels, Rotary.apply, KVPool.store, TorchAttentionBackend's C decode and cascade calls): the
 * result is bit-identical to it (tests/test_fused_decode.py). Rope and the K/V store are rope_store.c's,
 * which the module path calls too (Rotary's rounding points: see there).
 * Shapes: residual, h, out [M, hidden]; q heads first in qkv ([M, (H + 2 Hkv) D]); cos [M, D] and
 * sin [M, D / 2] of the rows' positions (Rotary's tables); pools [Hkv, slots, D]. M: at most what every linear's
 * module path runs with the same kernel (fused_decode.py: DENSE_MAX_M, 256 for dense tiles, 128 on GGUF int8
 * tiles / blocks, whose batches from Q8_TILES_GEMM_MIN_M (tiles) / above 16 rows (blocks) run gemm_kquant.c here
 * as in the modules).
 * Returns 0, -1 (a linear refused the shapes: the planner never lets that happen), -2 out of memory.
 */
#include "common.h"

#include "kernels.h"

/* decode_linear, decode_layer_weights and decode_step: kernels.h (the op table reads them from there) */

/* rows from which tiles of up to Q8_TILES_GEMM_MAX_N rows run gemm_kquant.c's panels (quant_ops.tiles_run_gemm: the
 * measured crossover) */
#define Q8_TILES_GEMM_MIN_M 16
#define Q8_TILES_GEMM_MAX_N 8192

static int run_linear(const decode_linear *l, const void *x, void *out, int64_t M, int bf16);

/* kind 5: the parts (w: decode_linear [fmt]) side by side, each writing its columns of out [M, N] */
static int run_parts(const decode_linear *l, const void *x, void *out, int64_t M, int bf16) {
    const decode_linear *parts = (const decode_linear *)l->w;
    const size_t el = bf16 ? 2 : 4;
    char *tmp = NULL;
    if (M > 1 && !(tmp = (char *)malloc((size_t)(M * l->N) * el))) return -2;
    int64_t c0 = 0;
    int rc = 0;
    for (int64_t i = 0; i < l->fmt && !rc; i++) {
        const int64_t n = parts[i].N;
        if (M == 1) { /* one row: the part's outputs are its columns */
            rc = run_linear(parts + i, x, (char *)out + c0 * el, 1, bf16);
        } else if (!(rc = run_linear(parts + i, x, tmp, M, bf16))) {
            for (int64_t m = 0; m < M; m++)
                memcpy((char *)out + (m * l->N + c0) * el, tmp + m * n * el, (size_t)n * el);
        }
        c0 += n;
    }
    free(tmp);
    return rc;
}

static int run_linear(const decode_linear *l, const void *x, void *out, int64_t M, int bf16) {
    int rc;
    if (l->kind == 0)
        rc = bf16 ? dense_gemv_bf16(x, l->K, l->w, l->bias, out, M, l->K, l->N)
                  : dense_gemv_f32(x, l->K, l->w, l->bias, out, M, l->K, l->N);
    else if (l->kind == 1)
        rc = bf16 ? gguf_gemv_bf16(x, l->w, l->fmt, out, M, l->K, l->N) : gguf_gemv_f32(x, l->w, l->fmt, out, M, l->K, l->N);
    else if (l->kind == 3) /* the GEMM on the same tiles where the modules run it (quant_ops.tiles_run_gemm) */
        rc = M > 16 || (M >= Q8_TILES_GEMM_MIN_M && l->N <= Q8_TILES_GEMM_MAX_N)
                 ? gguf_q8_tiles_gemm(x, bf16, l->w, l->fmt, out, bf16, M, l->K, l->N, l->N)
                 : gguf_q8_gemv(x, bf16, l->w, l->fmt, out, bf16, M, l->K, l->N);
    else if (l->kind == 4)
        rc = int8_q8_gemv(x, bf16, l->w, l->scale, out, bf16, M, l->K, l->N);
    else if (l->kind == 5)
        rc = run_parts(l, x, out, M, bf16);
    else if (l->kind == 6)
        rc = M > 16 ? gguf_kq_gemm(x, bf16, l->w, l->fmt, out, bf16, M, l->K, l->N, l->N)
                    : gguf_kq_gemv(x, bf16, l->w, l->fmt, out, bf16, M, l->K, l->N);
    else if (l->kind == 7)
        rc = gguf_dequant_gemv(x, bf16, l->w, l->fmt, out, bf16, M, l->K, l->N);
    else
        rc = bf16 ? qlinear_int8_bf16(x, l->w, l->scale, out, M, l->K, l->N)
                  : qlinear_int8_f32(x, l->w, l->scale, out, M, l->K, l->N);
    if (rc || l->kind == 0 || !l->bias) return rc;
    /* y + bias, rounded once (torch's add on the kernel's output) */
    for (int64_t i = 0; i < M * l->N; i++) {
        if (bf16) {
            uint16_t *o = (uint16_t *)out;
            o[i] = f32_to_bf16(bf16_to_f32(o[i]) + bf16_to_f32(((const uint16_t *)l->bias)[i % l->N]));
        } else {
            ((float *)out)[i] += ((const float *)l->bias)[i % l->N];
        }
    }
    return 0;
}

static int decode_layer(const decode_layer_weights *W, const decode_step *S, void *residual, const void *h, void *out,
                        int bf16) {
    const int64_t M = S->M, hid = S->hidden, D = S->D, qkv_n = (S->H + 2 * S->Hkv) * D;
    const size_t el = bf16 ? 2 : 4;
    /* scratch: x [M, hidden], qkv [M, qkv_n], q [M, H D], attn [M, H D], o [M, hidden], gu [M, 2I], act [M, I] */
    char *buf = (char *)malloc((size_t)M * (2 * hid + qkv_n + 2 * S->H * D + 3 * S->inter) * el);
    if (!buf) return -2;
    char *x = buf, *qkv = x + M * hid * el, *q = qkv + M * qkv_n * el, *attn = q + M * S->H * D * el;
    char *o = attn + M * S->H * D * el, *gu = o + M * hid * el, *act = gu + M * 2 * S->inter * el;
    int rc;
    if (bf16)
        add_rms_norm_bf16(residual, h, W->in_norm, (uint16_t *)x, M, hid, S->eps);
    else
        add_rms_norm_f32(residual, h, W->in_norm, (float *)x, M, hid, S->eps);
    if ((rc = run_linear(&W->qkv, x, qkv, M, bf16))) goto done;
    const void *cos = W->nope ? NULL : S->cos, *sin = W->nope ? NULL : S->sin; /* a NoPE layer: the store only */
    if (bf16)
        rope_store_bf16((uint16_t *)qkv, M, qkv_n, S->H, S->Hkv, D, cos, sin, S->out_loc, S->k_pools[W->layer],
                        S->v_pools[W->layer], S->slots);
    else
        rope_store_f32((float *)qkv, M, qkv_n, S->H, S->Hkv, D, cos, sin, S->out_loc, S->k_pools[W->layer],
                       S->v_pools[W->layer], S->slots);
    for (int64_t m = 0; m < M; m++) memcpy(q + m * S->H * D * el, qkv + m * qkv_n * el, S->H * D * el);
    const void *kp = S->k_pools[W->layer], *vp = S->v_pools[W->layer];
    const int windowed = W->window > 0; /* TorchAttentionBackend: the last `window` positions, one pass */
    if (S->groups && !windowed) { /* cpu_ops.shared_prefix */
        if (bf16)
            rc = (S->dpbf16 ? extend_causal_bf16 : extend_causal_portable_bf16)(
                (const uint16_t *)q, S->H * D, NULL, 0, NULL, 0, S->group_starts, S->group_counts, S->groups, S->H,
                S->Hkv, D, S->scale, (uint16_t *)S->prior_o, kp, vp, S->slots, S->req_to_token, S->ctx, S->group_rows,
                S->group_lens, NULL, S->q_index, S->prior_lse, NULL, NULL, 0);
        else
            rc = extend_causal_f32((const float *)q, S->H * D, NULL, 0, NULL, 0, S->group_starts, S->group_counts,
                                   S->groups, S->H, S->Hkv, D, S->scale, (float *)S->prior_o, kp, vp, S->slots,
                                   S->req_to_token, S->ctx, S->group_rows, S->group_lens, NULL, S->q_index,
                                   S->prior_lse, NULL, NULL, 0);
        if (rc) goto done;
    }
    /* without groups k_begin / prior_o / prior_lse are NULL (FusedDecode.run leaves them unset) */
    const int64_t *k_begin = windowed ? S->win_begin : S->k_begin;
    const void *prior_o = windowed ? NULL : S->prior_o;
    const float *prior_lse = windowed ? NULL : S->prior_lse;
    rc = bf16 ? paged_decode_bf16((const uint16_t *)q, kp, vp, S->req_to_token, S->req_rows, S->seq_lens, k_begin,
                                  prior_o, prior_lse, M, S->H, S->Hkv, D, S->slots, S->ctx, S->scale,
                                  (uint16_t *)attn)
              : paged_decode_f32((const float *)q, kp, vp, S->req_to_token, S->req_rows, S->seq_lens, k_begin,
                                 prior_o, prior_lse, M, S->H, S->Hkv, D, S->slots, S->ctx, S->scale,
                                 (float *)attn);
    if (rc) goto done;
    if ((rc = run_linear(&W->o, attn, o, M, bf16))) goto done;
    if (bf16)
        add_rms_norm_bf16(residual, (const uint16_t *)o, W->post_norm, (uint16_t *)x, M, hid, S->eps);
    else
        add_rms_norm_f32(residual, (const float *)o, W->post_norm, (float *)x, M, hid, S->eps);
    if ((rc = run_linear(&W->gate_up, x, gu, M, bf16))) goto done;
    if (bf16)
        silu_mul_bf16((const uint16_t *)gu, (uint16_t *)act, M, S->inter);
    else
        silu_mul_f32((const float *)gu, (float *)act, M, S->inter);
    rc = run_linear(&W->down, act, out, M, bf16);
done:
    free(buf);
    return rc;
}

int decode_layer_bf16(const decode_layer_weights *W, const decode_step *S, uint16_t *residual, const uint16_t *h,
                      uint16_t *out) {
    return decode_layer(W, S, residual, h, out, 1);
}

int decode_layer_f32(const decode_layer_weights *W, const decode_step *S, float *residual, const float *h,
                     float *out) {
    return decode_layer(W, S, residual, h, out, 0);
}
