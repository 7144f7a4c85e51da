"""Multi-head latent attention decode in Triton, absorbed form (DeepSeek V2 / V3, Kimi K2): split-KV
flash-decoding of all query heads over one layer's latent entries, read in place from the pool.

Shapes and layout (every tensor contiguous unless said otherwise):
  q            [B, H, C + R]      the absorbed query: q_nope @ W_UK (C lanes), then q_rope (R lanes);
                                  float32 / bfloat16 / float16 (any stride but the last)
  kv_pool      [N, C + R]         one layer's entries: latent (C = kv_lora_rank), then the roped key (R);
                                  same dtype as q. The value of an entry is its first C lanes: one buffer
                                  serves as key and value (no copy of the latents)
  req_to_token [rows, ctx] int64  slot of each position of each table row (pages of any size)
  req_rows     [B] int64          table row of each request
  seq_lens     [B] int64          positions 0 .. seq_len-1 are attended (all already in the pool)
  -> out       [B, H, C]          same dtype as q
Scores are q . entry over all C + R lanes times `scale`; softmax and accumulation in float32.

Stage 1, grid (B, cdiv(H, BLOCK_H), S): program (b, hb, s) takes BLOCK_H query heads as a [BLOCK_H, C]
latent block and a [BLOCK_H, R] rope block, and keys [s * L_split, (s + 1) * L_split) in blocks of
BLOCK_N; each block of entries is loaded once as its latent part [BLOCK_N, C] (the scores' first term
and the values) and its rope part [BLOCK_N, R] (the second term): the 576 lanes of DeepSeek V3 as
512 + 64, never one 1024-wide block. An online softmax gives a normalised partial output [BLOCK_H, C]
and its log-sum-exp per head. Stage 2 is decode_attention's reduction (grid (B, H), weights
exp(lse_s - max lse)).
Limits: C <= 512 and R <= 128 (padded to powers of two with masks); any H (heads in blocks of 16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlang_kernels.decode_attention import _decode_stage2
from radixlang_kernels.triton_common import INTERPRETED, dot, dot_precision, softmax_step

MAX_LATENT, MAX_ROPE = 512, 128
BLOCK_H = 16  # query heads per program (tl.dot's smallest M)


@triton.jit
def _mla_stage1(q_ptr, kv_ptr, rt_ptr, rows_ptr, lens_ptr, mid_o_ptr, mid_lse_ptr,
                stride_qb, stride_qh, stride_kv, stride_rt, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                scale, split_len, H, C: tl.constexpr, R: tl.constexpr, BLOCK_H: tl.constexpr,
                BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                UPCAST: tl.constexpr):
    b = tl.program_id(0)
    hb = tl.program_id(1)
    s = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    row = tl.load(rows_ptr + b)
    start = s * split_len
    end = tl.minimum(start + split_len, seq_len)

    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_c = tl.arange(0, BLOCK_C)
    offs_r = tl.arange(0, BLOCK_R)
    mask_h = heads < H
    mask_c = offs_c < C
    mask_r = offs_r < R
    q_row = q_ptr + b * stride_qb + heads[:, None] * stride_qh
    q_lat = tl.load(q_row + offs_c[None, :], mask=mask_h[:, None] & mask_c[None, :], other=0.0)  # [BLOCK_H, BLOCK_C]
    q_pe = tl.load(q_row + C + offs_r[None, :], mask=mask_h[:, None] & mask_r[None, :], other=0.0)  # [BLOCK_H, BLOCK_R]

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        slots = tl.load(rt_ptr + row * stride_rt + offs_n, mask=mask_n, other=0)  # int64: no overflow past 2^31
        entry = kv_ptr + slots[:, None] * stride_kv
        # the block's latents [BLOCK_N, BLOCK_C] (keys' first part and values) and rope parts [BLOCK_N, BLOCK_R]
        lat = tl.load(entry + offs_c[None, :], mask=mask_n[:, None] & mask_c[None, :], other=0.0)
        pe = tl.load(entry + C + offs_r[None, :], mask=mask_n[:, None] & mask_r[None, :], other=0.0)
        qk = (dot(q_lat, tl.trans(lat), PRECISION, UPCAST) + dot(q_pe, tl.trans(pe), PRECISION, UPCAST)) * scale
        qk = tl.where(mask_n[None, :], qk, float("-inf"))  # [BLOCK_H, BLOCK_N]
        m_i, l_i, acc = softmax_step(qk, lat, m_i, l_i, acc, PRECISION, UPCAST)  # values: the latents

    has_keys = end > start
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    mid = b * stride_mb + heads * stride_mh + s * stride_ms
    tl.store(mid_o_ptr + mid[:, None] + offs_c[None, :], out, mask=mask_h[:, None] & mask_c[None, :])
    tl.store(mid_lse_ptr + b * stride_lb + heads * stride_lh + s, lse, mask=mask_h)


def mla_decode(q: torch.Tensor, kv_pool: torch.Tensor, req_to_token: torch.Tensor, req_rows: torch.Tensor,
               seq_lens: torch.Tensor, latent_dim: int, scale: float, max_seq_len: int | None = None,
               split_len: int = 256, block_n: int = 32) -> torch.Tensor:
    """See the module docstring; latent_dim = C. max_seq_len (host int) sizes the split grid, any bound on
    seq_lens; default: seq_lens.max(). ValueError for shapes outside the limits."""
    B, H, E = q.shape
    C, R = latent_dim, E - latent_dim
    if kv_pool.dim() != 2 or kv_pool.shape[1] != E:
        raise ValueError(f"kv_pool must be [N, {E}] (C + R lanes, as q's last dimension); got {tuple(kv_pool.shape)}")
    if kv_pool.dtype != q.dtype:
        raise ValueError(f"kv_pool's dtype {kv_pool.dtype} differs from q's {q.dtype}")
    if not (0 < C <= MAX_LATENT and 0 < R <= MAX_ROPE):
        raise ValueError(f"latent_dim {C} and rope lanes {R} must be in 1..{MAX_LATENT} and 1..{MAX_ROPE}")
    if q.stride(-1) != 1 or kv_pool.stride(-1) != 1:
        raise ValueError("the last dimension of q and kv_pool must be contiguous")
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item()) if B else 0
    S = max(1, triton.cdiv(max_seq_len, split_len))
    out = q.new_empty(B, H, C)  # [B, H, C]
    if B == 0:
        return out
    mid_o = torch.empty(B, H, S, C, dtype=torch.float32, device=q.device)  # [B, H, S, C] per split
    mid_lse = torch.empty(B, H, S, dtype=torch.float32, device=q.device)  # [B, H, S]
    BLOCK_C = max(16, triton.next_power_of_2(C))
    BLOCK_R = max(16, triton.next_power_of_2(R))
    _mla_stage1[(B, triton.cdiv(H, BLOCK_H), S)](
        q, kv_pool, req_to_token, req_rows, seq_lens, mid_o, mid_lse,
        q.stride(0), q.stride(1), kv_pool.stride(0), req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        scale, split_len, H, C=C, R=R, BLOCK_H=BLOCK_H, BLOCK_C=BLOCK_C, BLOCK_R=BLOCK_R, BLOCK_N=block_n,
        PRECISION=dot_precision(q.dtype), UPCAST=INTERPRETED,
    )
    _decode_stage2[(B, H)](  # the unread pointers (k_begin, the prior, sinks) get stand-ins
        mid_o, mid_lse, out, seq_lens, seq_lens, mid_o, mid_lse, mid_lse,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1), 0, 0, 0, 0, split_len, S,
        D=C, BLOCK_D=BLOCK_C, HAS_BEGIN=False, HAS_PRIOR=False, HAS_SINKS=False,
    )
    return out
