"""Paged decode attention in Triton: split-KV flash-decoding in two stages, grouped for GQA.

Shapes and layout (every tensor contiguous unless said otherwise):
  q            [B, H, D]          one query token per request; float32 / bfloat16 / float16
  k_buffer     [Hkv, N, D]        the KV pool of one layer (N slots), same dtype as q
  v_buffer     [Hkv, N, D]
  req_to_token [rows, ctx] int64  slot of each position of each table row (any page size: one entry
                                  per position, so pages of 1 and 16 look the same here)
  req_rows     [B] int64          table row of each request
  seq_lens     [B] int64          positions 0 .. seq_len-1 are attended (all already in the pool)
  k_begin      [B] int64          optional: request b attends positions k_begin[b] .. seq_len-1 only
  prior_o      [B, H, D]          optional (with prior_lse): an output over other keys, dtype of q or
  prior_lse    [B, H] float32     float32, and its log-sum-exp (-inf: no keys, weight 0), merged in
  -> out       [B, H, D]          same dtype as q
Query head h reads KV head h // (H // Hkv). Scores, softmax and accumulation are float32.
Cascade attention (radixlang_runtime/model/layers/attention/cascade.py) passes k_begin = each request's
shared length and the shared part's (o, lse) as the prior; without them the kernels run as before.

Stage 1, grid (B, Hkv, S): program (b, g, s) takes the G = H / Hkv query heads of KV head g as one
[G, D] block and a split of the context, keys k_begin + [s * L_split, (s + 1) * L_split) in blocks
of BLOCK_N; an online softmax gives a normalised partial output and its log-sum-exp per query head.
Stage 2, grid (B, H): partial outputs, then the prior, merge with weights exp(lse_s - max lse).
Optional logit soft-cap c > 0: scores become c * tanh(scores / c) (Gemma-2 / Grok style).
Optional attention sinks [H] float32 (gpt-oss): a logit per query head merged last into the denominator.
Limits: D <= 256 (padded to a power of two with masks, so 80 or 96 work); G <= 64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlang_kernels.triton_common import INTERPRETED, attend_paged, dot_precision


@triton.jit
def _decode_stage1(q_ptr, k_ptr, v_ptr, rt_ptr, rows_ptr, lens_ptr, begin_ptr, mid_o_ptr, mid_lse_ptr,
                   stride_qb, stride_qh, stride_kh, stride_ks, stride_rt, stride_mb, stride_mh, stride_ms,
                   stride_lb, stride_lh, scale, soft_cap, split_len,
                   G: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_N: tl.constexpr, SOFT_CAP: tl.constexpr, HAS_BEGIN: tl.constexpr,
                   PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    b = tl.program_id(0)
    g = tl.program_id(1)
    s = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    row = tl.load(rows_ptr + b)
    start = s * split_len
    if HAS_BEGIN:
        start += tl.load(begin_ptr + b)
    end = tl.minimum(start + split_len, seq_len)

    offs_g = tl.arange(0, BLOCK_G)  # query heads of this KV head
    offs_d = tl.arange(0, BLOCK_D)
    mask_g = offs_g < G
    mask_d = offs_d < D
    heads = g * G + offs_g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_g[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_G, BLOCK_D], input dtype

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    kv_off = g.to(tl.int64) * stride_kh  # int64: past 2^31 in a large pool (attend_paged)
    m_i, l_i, acc = attend_paged(q, m_i, l_i, acc, k_ptr, v_ptr, rt_ptr, row, stride_rt, kv_off, stride_ks,
                                 start, end, offs_d, mask_d, scale, soft_cap, BLOCK_N, SOFT_CAP, PRECISION, UPCAST)

    has_keys = end > start
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    mid = b * stride_mb + heads * stride_mh + s * stride_ms
    tl.store(mid_o_ptr + mid[:, None] + offs_d[None, :], out, mask=mask_g[:, None] & mask_d[None, :])
    tl.store(mid_lse_ptr + b * stride_lb + heads * stride_lh + s, lse, mask=mask_g)


@triton.jit
def _decode_stage2(mid_o_ptr, mid_lse_ptr, o_ptr, lens_ptr, begin_ptr, prior_o_ptr, prior_lse_ptr, sinks_ptr,
                   stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
                   stride_pb, stride_ph, stride_plb, stride_plh, split_len, S,
                   D: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BEGIN: tl.constexpr, HAS_PRIOR: tl.constexpr,
                   HAS_SINKS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    seq_len = tl.load(lens_ptr + b)  # stage 1 split [begin, seq_len): seq_len - begin keys
    if HAS_BEGIN:
        seq_len -= tl.load(begin_ptr + b)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    m = tl.zeros([], tl.float32) - float("inf")  # tensors from the start: loop-carried types must not change
    den = tl.zeros([], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    n_splits = tl.minimum(tl.cdiv(seq_len, split_len), S)
    for s in range(0, n_splits):
        base = b * stride_mb + h * stride_mh + s * stride_ms
        lse = tl.load(mid_lse_ptr + b * stride_lb + h * stride_lh + s)
        o_s = tl.load(mid_o_ptr + base + offs_d, mask=mask_d, other=0.0)
        m_new = tl.maximum(m, lse)
        scale_old = tl.exp(m - m_new)
        w = tl.exp(lse - m_new)
        acc = acc * scale_old + w * o_s
        den = den * scale_old + w
        m = m_new
    if HAS_PRIOR:  # one more partial; after the splits so m is finite there unless the own part is empty
        lse = tl.load(prior_lse_ptr + b * stride_plb + h * stride_plh)
        o_p = tl.load(prior_o_ptr + b * stride_pb + h * stride_ph + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        m_new = tl.maximum(m, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # both -inf: weights 0, not nan
        scale_old = tl.exp(m - m_safe)
        w = tl.exp(lse - m_safe)
        acc = acc * scale_old + w * o_p
        den = den * scale_old + w
        m = m_new
    if HAS_SINKS:  # the head's sink logit: one more term of the denominator, no value
        sink = tl.load(sinks_ptr + h).to(tl.float32)
        m_new = tl.maximum(m, sink)
        scale_old = tl.exp(m - m_new)
        acc = acc * scale_old
        den = den * scale_old + tl.exp(sink - m_new)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d, acc / den, mask=mask_d)


def decode_attention(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, req_to_token: torch.Tensor,
                     req_rows: torch.Tensor, seq_lens: torch.Tensor, scale: float, soft_cap: float = 0.0,
                     max_seq_len: int | None = None, split_len: int = 256, block_n: int = 32,
                     k_begin: torch.Tensor | None = None, prior_o: torch.Tensor | None = None,
                     prior_lse: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """See the module docstring. max_seq_len (host int) sizes the split grid, any bound on
    seq_lens - k_begin; default: seq_lens.max(). prior_o and prior_lse come together. sinks [H]
    (attention sinks): each head's logit joins the softmax denominator, weighing no value."""
    if (prior_o is None) != (prior_lse is None):
        raise ValueError("prior_o and prior_lse come together")
    if prior_o is not None and prior_o.stride(-1) != 1:
        raise ValueError("the last dimension of prior_o must be contiguous")
    B, H, D = q.shape
    hkv = k_buffer.shape[0]
    if H % hkv or D > 256:
        raise ValueError(f"unsupported shape: H={H}, Hkv={hkv}, D={D}")
    G = H // hkv
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item()) if B else 0
    S = max(1, triton.cdiv(max_seq_len, split_len))
    out = torch.empty_like(q)
    if B == 0:
        return out
    mid_o = torch.empty(B, H, S, D, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(B, H, S, dtype=torch.float32, device=q.device)
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_G = max(16, triton.next_power_of_2(G))
    q = q.contiguous()
    has_begin, has_prior = k_begin is not None, prior_o is not None
    begin = k_begin if has_begin else seq_lens  # an unread stand-in when absent
    p_o, p_lse = (prior_o, prior_lse) if has_prior else (mid_o, mid_lse)
    _decode_stage1[(B, hkv, S)](
        q, k_buffer, v_buffer, req_to_token, req_rows, seq_lens, begin, mid_o, mid_lse,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        scale, soft_cap, split_len,
        G=G, D=D, BLOCK_G=BLOCK_G, BLOCK_D=BLOCK_D, BLOCK_N=block_n, SOFT_CAP=soft_cap > 0, HAS_BEGIN=has_begin,
        PRECISION=dot_precision(q.dtype), UPCAST=INTERPRETED,
    )
    _decode_stage2[(B, H)](
        mid_o, mid_lse, out, seq_lens, begin, p_o, p_lse, sinks if sinks is not None else mid_lse,  # stand-in
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1), out.stride(0), out.stride(1), p_o.stride(0), p_o.stride(1),
        p_lse.stride(0), p_lse.stride(1), split_len, S, D=D, BLOCK_D=BLOCK_D, HAS_BEGIN=has_begin,
        HAS_PRIOR=has_prior, HAS_SINKS=sinks is not None,
    )
    return out
