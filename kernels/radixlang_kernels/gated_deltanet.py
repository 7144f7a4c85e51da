"""Gated DeltaNet in Triton (Qwen3-Next, Qwen3.5 linear-attention layers): the GPU counterpart of
csrc/cpu/gated_deltanet.c, its states read and written in place at their slots of one layer's state pool.

Both kernels run over segments of rows (segment r: rows starts[r] .. starts[r] + lens[r] - 1 of the step, from
state slot slots[r]); decode is the case of one row per segment, a prefill chunk of a request one segment.
  conv: the causal depthwise convolution of width K. x [T, C] (rows may be strided, channels contiguous),
        conv [N, C, K - 1] (per slot the last K - 1 inputs, oldest first), w [C, K] -> out [T, C] float32 =
        silu(w[c] . inputs t-K+1 .. t); each slot's window then holds its segment's last K - 1 inputs.
        Grid (segments, channel blocks): a token's inputs before the segment come from the window, which the
        same program rewrites after its loop (entry j reads old entry lens + j > j: in order, nothing is read
        after it is overwritten). bf16 inputs round the sum and the SiLU to bf16, as torch's bf16 conv1d does.
  rule: the gated delta rule token after token (the recurrent form, as gdn_prefill_f32). qkv [T, *] float32
        (the convolved q [Hk, Dk], k [Hk, Dk], v [Hv, Dv] channels), g / beta [T, Hv] float32, state
        [N, Hv, Dk, Dv] float32 -> o [T, Hv, Dv] float32. Per (segment, value head h reading key head
        h / (Hv / Hk)), S [Dk, Dv] stays in registers across the segment's tokens:
            q, k <- l2norm (x / sqrt(sum x^2 + 1e-6)), q <- q / sqrt(Dk);
            S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q.
        Grid (segments, Hv).
The arithmetic is reference.gdn_decode_ref's (transformers' torch_recurrent_gated_delta_rule and causal conv1d
update) in float32, in another order: results agree to rounding, not bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv_kernel(x_ptr, conv_ptr, w_ptr, slots_ptr, starts_ptr, lens_ptr, out_ptr, C, stride_x,
                 K: tl.constexpr, BLOCK_C: tl.constexpr, BF16: tl.constexpr):
    r = tl.program_id(0)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    slot = tl.load(slots_ptr + r)
    start = tl.load(starts_ptr + r)
    n = tl.load(lens_ptr + r)
    W: tl.constexpr = K - 1
    zero = tl.zeros((BLOCK_C,), dtype=tl.int64)  # positions as vectors: masks of the channels' shape
    win_ptr = conv_ptr + (slot * C + offs_c) * W
    for t in range(0, n):
        y = tl.zeros((BLOCK_C,), dtype=tl.float32)
        for i in tl.static_range(K):
            src = zero + (t - W + i)  # the input's row in the segment; before it: window entry W + src
            from_x = tl.load(x_ptr + (start + src) * stride_x + offs_c, mask=mask_c & (src >= 0), other=0.0)
            from_win = tl.load(win_ptr + W + src, mask=mask_c & (src < 0), other=0.0)
            inp = tl.where(src >= 0, from_x.to(tl.float32), from_win.to(tl.float32))
            y += tl.load(w_ptr + offs_c * K + i, mask=mask_c, other=0.0).to(tl.float32) * inp
        if BF16:
            y = y.to(tl.bfloat16).to(tl.float32)
        y = y / (1.0 + tl.exp(-y))
        if BF16:
            y = y.to(tl.bfloat16).to(tl.float32)
        tl.store(out_ptr + (start + t) * C + offs_c, y, mask=mask_c)
    for j in tl.static_range(W):  # the new window: the last W inputs of [old window, the segment's rows]
        src = zero + (n - W + j)
        from_x = tl.load(x_ptr + (start + src) * stride_x + offs_c, mask=mask_c & (src >= 0), other=0.0)
        from_win = tl.load(win_ptr + W + src, mask=mask_c & (src < 0), other=0.0)
        tl.store(win_ptr + j, tl.where(src >= 0, from_x, from_win), mask=mask_c)


@triton.jit
def _rule_kernel(qkv_ptr, g_ptr, beta_ptr, state_ptr, slots_ptr, starts_ptr, lens_ptr, out_ptr, stride_qkv,
                 Hk, Hv, Dk, Dv, scale, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    r = tl.program_id(0)
    h = tl.program_id(1)
    hk = h // (Hv // Hk)
    slot = tl.load(slots_ptr + r)
    start = tl.load(starts_ptr + r)
    n = tl.load(lens_ptr + r)
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.arange(0, BLOCK_V)
    mask_k = offs_k < Dk
    mask_v = offs_v < Dv
    mask_s = mask_k[:, None] & mask_v[None, :]
    s_ptrs = state_ptr + ((slot * Hv + h) * Dk + offs_k[:, None]) * Dv + offs_v[None, :]
    S = tl.load(s_ptrs, mask=mask_s, other=0.0)
    for t in range(start, start + n):
        row = qkv_ptr + t * stride_qkv
        q = tl.load(row + hk * Dk + offs_k, mask=mask_k, other=0.0)
        k = tl.load(row + (Hk + hk) * Dk + offs_k, mask=mask_k, other=0.0)
        v = tl.load(row + 2 * Hk * Dk + h * Dv + offs_v, mask=mask_v, other=0.0)
        q = q / tl.sqrt(tl.sum(q * q, 0) + 1e-6) * scale
        k = k / tl.sqrt(tl.sum(k * k, 0) + 1e-6)
        g = tl.load(g_ptr + t * Hv + h)
        beta = tl.load(beta_ptr + t * Hv + h)
        S = S * tl.exp(g)
        delta = (v - tl.sum(S * k[:, None], 0)) * beta
        S = S + k[:, None] * delta[None, :]
        tl.store(out_ptr + (t * Hv + h) * Dv + offs_v, tl.sum(S * q[:, None], 0), mask=mask_v)
    tl.store(s_ptrs, S, mask=mask_s)


def gdn_conv(x: torch.Tensor, conv: torch.Tensor, weight: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor,
             lens: torch.Tensor) -> torch.Tensor:
    """The convolution over segments (module docstring): x [T, C] bf16 / float16 / float32, conv [N, C, K - 1]
    contiguous (updated in place), weight [C, K], slots / starts / lens [R] int64 -> [T, C] float32."""
    T, C = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    K = weight.shape[1]
    assert conv.is_contiguous() and conv.shape[1:] == (C, K - 1) and conv.dtype == x.dtype
    out = torch.empty(T, C, dtype=torch.float32, device=x.device)
    R = lens.shape[0]
    if R:
        block = min(triton.next_power_of_2(C), 128)
        _conv_kernel[(R, triton.cdiv(C, block))](x, conv, weight.contiguous(), slots, starts, lens, out, C,
                                                 x.stride(0), K=K, BLOCK_C=block, BF16=x.dtype == torch.bfloat16)
    return out


def gdn_rule(qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
             starts: torch.Tensor, lens: torch.Tensor, num_k_heads: int) -> torch.Tensor:
    """The gated delta rule token after token over segments (module docstring): qkv [T, *] float32 (rows may be
    strided), g / beta [T, Hv] float32, state [N, Hv, Dk, Dv] float32 contiguous (updated in place), slots /
    starts / lens [R] int64 -> o [T, Hv, Dv] float32."""
    T = qkv.shape[0]
    _, Hv, Dk, Dv = state.shape
    assert qkv.dtype == g.dtype == beta.dtype == state.dtype == torch.float32 and state.is_contiguous()
    if qkv.stride(1) != 1:
        qkv = qkv.contiguous()
    out = torch.empty(T, Hv, Dv, dtype=torch.float32, device=qkv.device)
    R = lens.shape[0]
    if R:
        _rule_kernel[(R, Hv)](qkv, g.contiguous(), beta.contiguous(), state, slots, starts, lens, out, qkv.stride(0),
                              num_k_heads, Hv, Dk, Dv, Dk ** -0.5, BLOCK_K=triton.next_power_of_2(Dk),
                              BLOCK_V=triton.next_power_of_2(Dv))
    return out
