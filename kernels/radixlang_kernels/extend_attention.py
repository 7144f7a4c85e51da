"""Paged extend (prefill) attention in Triton: new tokens attend to their cached prefix and causally
to themselves, with one online softmax across both.

Shapes and layout:
  q_extend     [T, H, D]          the new tokens of all requests, request r at rows
                                  extend_starts[r] .. extend_starts[r] + extend_lens[r] - 1
  k_extend     [T, Hkv, D]        their keys / values (rows may be strided views of a fused qkv; the
  v_extend     [T, Hkv, D]        last dimension must be contiguous)
  k_buffer     [Hkv, N, D]        the KV pool of one layer, read for the prefix
  v_buffer     [Hkv, N, D]
  req_to_token [rows, ctx] int64  slot of each position (one entry per position: any page size)
  req_rows, prefix_lens, extend_lens, extend_starts: [R] int64
  -> out       [T, H, D]          dtype of q
New token i of request r sits at position prefix_lens[r] + i and sees positions 0 .. prefix_lens[r] + i;
with window w > 0 (sliding-window attention) only those > prefix_lens[r] + i - w: the key loops start at
the block's first visible position and mask per row; with chunk c > 0 (chunked local attention, Llama 4)
only those >= p - p % c for the query at position p (its own chunk), bounded and masked the same way.
dtypes float32 / bfloat16 / float16; float32 math. Query head h reads KV head h // (H / Hkv).

Grid (R, H, cdiv(max extend_len, BLOCK_M)): a program owns BLOCK_M queries of one head. Stage 1 walks
the prefix in BLOCK_N blocks through req_to_token (no mask but the length); stage 2 walks the new keys
up to its last query with the causal mask. Optional logit soft-cap c > 0: c * tanh(scores / c). Optional
attention sinks [H] float32 (gpt-oss): a logit per head added to each row's softmax denominator.
Limits: D <= 256 (padded to a power of two with masks: 80 and 96 work).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlang_kernels.triton_common import INTERPRETED, attend_paged, dot_precision, scores, softmax_step


@triton.jit
def _extend_kernel(q_ptr, ke_ptr, ve_ptr, kb_ptr, vb_ptr, rt_ptr, rows_ptr, pre_ptr, ext_ptr, start_ptr, o_ptr,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                   stride_bh, stride_bs, stride_rt, stride_ot, stride_oh,
                   scale, soft_cap, window, sinks_ptr, chunk,
                   G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, SOFT_CAP: tl.constexpr, PRECISION: tl.constexpr,
                   UPCAST: tl.constexpr, WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr, CHUNK: tl.constexpr):
    r = tl.program_id(0)
    h = tl.program_id(1)
    mb = tl.program_id(2)
    n_ext = tl.load(ext_ptr + r)
    if mb * BLOCK_M >= n_ext:
        return
    prefix = tl.load(pre_ptr + r)
    row = tl.load(rows_ptr + r)
    q_start = tl.load(start_ptr + r)
    kvh = h // G

    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the request's new tokens
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < n_ext
    mask_d = offs_d < D
    q = tl.load(q_ptr + (q_start + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_M, BLOCK_D], input dtype

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # stage 1: the cached prefix, from the pool (with a window or a chunk: from the block's first query's first key)
    first = 0
    if WINDOW:
        first = tl.maximum(prefix + mb * BLOCK_M - window + 1, 0)
    if CHUNK:
        first = prefix + mb * BLOCK_M - (prefix + mb * BLOCK_M) % chunk
    kv_off = kvh.to(tl.int64) * stride_bh  # int64: past 2^31 in a large pool (attend_paged)
    m_i, l_i, acc = attend_paged(q, m_i, l_i, acc, kb_ptr, vb_ptr, rt_ptr, row, stride_rt, kv_off, stride_bs,
                                 first, prefix, offs_d, mask_d, scale, soft_cap, BLOCK_N, SOFT_CAP, PRECISION, UPCAST,
                                 prefix + offs_m, window, WINDOW, chunk, CHUNK)

    # stage 2: the new tokens, causal (key j visible to query i iff j <= i, and j > i - window, and in i's chunk)
    last = tl.minimum((mb + 1) * BLOCK_M, n_ext)
    first_new = 0
    if WINDOW:
        first_new = tl.maximum(mb * BLOCK_M - window + 1, 0)
    if CHUNK:
        first_new = tl.maximum(first - prefix, 0)
    for n0 in range(first_new, last, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < n_ext
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(ke_ptr + (q_start + offs_n)[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        v = tl.load(ve_ptr + (q_start + offs_n)[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        visible = mask_n[None, :] & (offs_n[None, :] <= offs_m[:, None])
        if WINDOW:
            visible = visible & (offs_n[None, :] > offs_m[:, None] - window)
        if CHUNK:
            q_pos = prefix + offs_m
            visible = visible & (prefix + offs_n[None, :] >= (q_pos - q_pos % chunk)[:, None])
        qk = scores(q, k, visible, scale, soft_cap, SOFT_CAP, PRECISION, UPCAST)
        m_i, l_i, acc = softmax_step(qk, v, m_i, l_i, acc, PRECISION, UPCAST)

    if HAS_SINKS:  # the head's sink logit joins the denominator and weighs no value
        sink = tl.load(sinks_ptr + h).to(tl.float32)
        m_new = tl.maximum(m_i, sink)
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.exp(sink - m_new)
        acc = acc * alpha[:, None]
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o_ptr + (q_start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :], out,
             mask=mask_m[:, None] & mask_d[None, :])


def extend_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                     req_to_token: torch.Tensor, req_rows: torch.Tensor, prefix_lens: torch.Tensor,
                     extend_lens: torch.Tensor, extend_starts: torch.Tensor, scale: float, soft_cap: float = 0.0,
                     max_extend_len: int | None = None, block_m: int = 32, block_n: int = 32,
                     window: int = 0, sinks: torch.Tensor | None = None, chunk: int = 0) -> torch.Tensor:
    """See the module docstring. max_extend_len (host int) sizes the grid; default: extend_lens.max().
    chunk > 0: chunked local attention (not with a window).
    sinks [H] (attention sinks): each head's logit joins every row's softmax denominator, weighing no value."""
    T, H, D = q.shape
    hkv = k.shape[1]
    if H % hkv or D > 256:
        raise ValueError(f"unsupported shape: H={H}, Hkv={hkv}, D={D}")
    for t in (q, k, v):
        if t.stride(-1) != 1:
            raise ValueError("the last dimension of q / k / v must be contiguous")
    if window > 0 and chunk > 0:
        raise ValueError(f"a layer attends either in a window ({window}) or in chunks ({chunk}), not both")
    R = req_rows.shape[0]
    out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
    if R == 0 or T == 0:
        return out
    if max_extend_len is None:
        max_extend_len = int(extend_lens.max().item())
    BLOCK_D = max(16, triton.next_power_of_2(D))
    grid = (R, H, triton.cdiv(max_extend_len, block_m))
    _extend_kernel[grid](
        q, k, v, k_buffer, v_buffer, req_to_token, req_rows, prefix_lens, extend_lens, extend_starts, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), req_to_token.stride(0), out.stride(0), out.stride(1),
        scale, soft_cap, window, sinks if sinks is not None else prefix_lens,  # an unread stand-in when absent
        max(chunk, 1),
        G=H // hkv, D=D, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=BLOCK_D, SOFT_CAP=soft_cap > 0,
        PRECISION=dot_precision(q.dtype), UPCAST=INTERPRETED, WINDOW=window > 0, HAS_SINKS=sinks is not None,
        CHUNK=chunk > 0,
    )
    return out
