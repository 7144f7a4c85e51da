"""Shared-prefix attention in Triton: the shared part of cascade attention (see
radixlang_runtime/model/layers/attention/cascade.py). Each group's prefix K/V is read once for all query
rows of all its members, not once per request.

Shapes and layout:
  q            [T, H, D]          query rows (decode: one per request; extend: the new tokens);
                                  float32 / bfloat16 / float16
  k_buffer     [Hkv, N, D]        the KV pool of one layer, same dtype as q
  v_buffer     [Hkv, N, D]
  req_to_token [rows, ctx] int64  slot of each position (one entry per position: any page size)
  group_rows   [Gn] int64         table row holding group g's shared slots in positions 0 .. P_g - 1
  group_lens   [Gn] int64         P_g
  q_index      [E] int64          rows of q of group g: q_index[group_starts[g] : group_starts[g + 1]]
  group_starts [Gn + 1] int64     (a row of q is in at most one group)
  -> o         [T, H, D]          normalised output of each grouped row over its group's prefix
                                  (dtype of the out_o given, else of q)
  -> lse       [T, H] float32     log-sum-exp of its scaled (soft-capped) scores; -inf when P_g = 0
Rows of q in no group are left untouched in o and lse. No causal mask: every query sits past the
prefix. Query head h reads KV head h // (H / Hkv); scores, softmax and accumulation are float32.

Grid (Gn, Hkv, cdiv(max_group_rows, BLOCK_M)): a program takes BLOCK_M query rows of one group and
the G = H / Hkv query heads of one KV head, flattened into one M axis of BLOCK_M * BLOCK_G rows of
the dot (row-major: m = row * BLOCK_G + head), and walks the prefix in BLOCK_N blocks with an online
softmax, so each K/V block is loaded once for all of them.
Optional logit soft-cap c > 0: scores become c * tanh(scores / c).
Limits: D <= 256 (padded to a power of two with masks, so 80 or 96 work); G <= 64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlang_kernels.triton_common import INTERPRETED, attend_paged, dot_precision


@triton.jit
def _prefix_kernel(q_ptr, k_ptr, v_ptr, rt_ptr, grows_ptr, glens_ptr, qidx_ptr, gstarts_ptr, o_ptr, lse_ptr,
                   stride_qt, stride_qh, stride_kh, stride_ks, stride_rt, stride_ot, stride_oh,
                   stride_lt, stride_lh, scale, soft_cap,
                   G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SOFT_CAP: tl.constexpr,
                   PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    grp = tl.program_id(0)
    g = tl.program_id(1)
    mb = tl.program_id(2)
    first = tl.load(gstarts_ptr + grp)
    n_rows = tl.load(gstarts_ptr + grp + 1) - first
    if mb * BLOCK_M >= n_rows:
        return
    row = tl.load(grows_ptr + grp)
    prefix = tl.load(glens_ptr + grp)

    offs_m = tl.arange(0, BLOCK_M * BLOCK_G)
    offs_r = mb * BLOCK_M + offs_m // BLOCK_G  # query row within the group
    offs_h = offs_m % BLOCK_G  # query head within KV head g
    offs_d = tl.arange(0, BLOCK_D)
    mask_r = offs_r < n_rows
    mask_m = mask_r & (offs_h < G)
    mask_d = offs_d < D
    tok = tl.load(qidx_ptr + first + offs_r, mask=mask_r, other=0)  # [M] row of q
    heads = g * G + offs_h
    q = tl.load(q_ptr + tok[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)  # [M, BLOCK_D], input dtype

    m_i = tl.full([BLOCK_M * BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M * BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_M * BLOCK_G, BLOCK_D], tl.float32)
    kv_off = g.to(tl.int64) * stride_kh  # int64: past 2^31 in a large pool (attend_paged)
    m_i, l_i, acc = attend_paged(q, m_i, l_i, acc, k_ptr, v_ptr, rt_ptr, row, stride_rt, kv_off, stride_ks,
                                 0, prefix, offs_d, mask_d, scale, soft_cap, BLOCK_N, SOFT_CAP, PRECISION, UPCAST)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    lse = tl.where(prefix > 0, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    tl.store(o_ptr + tok[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :], out,
             mask=mask_m[:, None] & mask_d[None, :])
    tl.store(lse_ptr + tok * stride_lt + heads * stride_lh, lse, mask=mask_m)


def shared_prefix_attention(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                            req_to_token: torch.Tensor, group_rows: torch.Tensor, group_lens: torch.Tensor,
                            q_index: torch.Tensor, group_starts: torch.Tensor, scale: float, soft_cap: float = 0.0,
                            max_group_rows: int | None = None, max_shared: int | None = None,
                            out_o: torch.Tensor | None = None, out_lse: torch.Tensor | None = None,
                            block_mg: int = 64, block_n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """See the module docstring; the group tensors are a CascadePlan's. Host ints (default: read
    from the tensors, a device sync): max_group_rows sizes the grid; max_shared (max P_g) is checked
    against the table width. out_o [T, H, D] (q's dtype or float32, last dim contiguous) and out_lse
    [T, H] float32 are written in place when given, else o = zeros and lse = -inf are allocated.
    block_mg: query rows x heads per program (>= 16)."""
    T, H, D = q.shape
    hkv = k_buffer.shape[0]
    if H % hkv or D > 256:
        raise ValueError(f"unsupported shape: H={H}, Hkv={hkv}, D={D}")
    o = torch.zeros_like(q) if out_o is None else out_o
    lse = torch.full((T, H), float("-inf"), dtype=torch.float32, device=q.device) if out_lse is None else out_lse
    if o.stride(-1) != 1:
        raise ValueError("the last dimension of out_o must be contiguous")
    Gn = group_rows.shape[0]
    if Gn == 0:
        return o, lse
    if max_group_rows is None:
        max_group_rows = int(group_starts.diff().max().item())
    if max_shared is None:
        max_shared = int(group_lens.max().item())
    if max_shared > req_to_token.shape[1]:
        raise ValueError(f"max_shared={max_shared} exceeds the table width {req_to_token.shape[1]}")
    G = H // hkv
    BLOCK_G = triton.next_power_of_2(G)
    BLOCK_M = max(1, block_mg // BLOCK_G)  # M = BLOCK_M * BLOCK_G = max(block_mg, BLOCK_G)
    BLOCK_D = max(16, triton.next_power_of_2(D))
    q = q.contiguous()
    _prefix_kernel[(Gn, hkv, max(1, triton.cdiv(max_group_rows, BLOCK_M)))](
        q, k_buffer, v_buffer, req_to_token, group_rows, group_lens, q_index, group_starts, o, lse,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), req_to_token.stride(0),
        o.stride(0), o.stride(1), lse.stride(0), lse.stride(1), scale, soft_cap,
        G=G, D=D, BLOCK_M=BLOCK_M, BLOCK_G=BLOCK_G, BLOCK_N=block_n, BLOCK_D=BLOCK_D, SOFT_CAP=soft_cap > 0,
        PRECISION=dot_precision(q.dtype), UPCAST=INTERPRETED,
    )
    return o, lse
