"""LoRA shrink and expand over row segments in Triton (SGMV, as SGLang's and Punica's): the GPU counterpart of
csrc/cpu/lora_sgmv.c, with the adapters' weights stacked in buffers indexed per segment.

Shapes and layout:
  x          [T, K]          the linear's input (float32 / bfloat16 / float16), rows contiguous
  rows       [R] int64       the step's rows, adapter by adapter: segment s is rows[seg_starts[s]:seg_starts[s + 1]]
  seg_starts [S + 1] int64
  seg_lora   [S] int64       the adapter slot of each segment (an index into the buffers)
  ranks      [L] int64       each slot's rank (<= the buffers' R)
  a_buffer   [L, R, K]       A of each slot (rows past its rank unused)
  b_buffer   [L, N, R]       B * scaling of each slot (columns past its rank unused)
  shrink -> t [R_rows, R] float32: t[j, :rank] = x[rows[j]] @ A^T (columns past the rank are 0)
  expand: y [T, N] (a view: row stride any, columns contiguous) += t[j] @ B^T at rows[j], in place
Grid (S, cdiv(max segment rows, BLOCK_M), cdiv(R or N, BLOCK_R / BLOCK_N)); products in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlang_kernels.triton_common import INTERPRETED, dot, dot_precision


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, rows_ptr, starts_ptr, lora_ptr, ranks_ptr, t_ptr, K,
                   stride_x, stride_al, stride_ar, stride_t,
                   BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                   PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    s = tl.program_id(0)
    mb = tl.program_id(1)
    rb = tl.program_id(2)
    first = tl.load(starts_ptr + s)
    n_rows = tl.load(starts_ptr + s + 1) - first
    if mb * BLOCK_M >= n_rows:
        return
    slot = tl.load(lora_ptr + s)
    rank = tl.load(ranks_ptr + slot)
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < n_rows
    mask_r = offs_r < rank
    rows = tl.load(rows_ptr + first + offs_m, mask=mask_m, other=0)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = k0 + offs_k < K
        xb = tl.load(x_ptr + rows[:, None] * stride_x + (k0 + offs_k)[None, :],
                     mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        ab = tl.load(a_ptr + slot * stride_al + offs_r[None, :] * stride_ar + (k0 + offs_k)[:, None],
                     mask=mask_r[None, :] & mask_k[:, None], other=0.0)
        acc += dot(xb, ab, PRECISION, UPCAST)
    tl.store(t_ptr + (first + offs_m)[:, None] * stride_t + offs_r[None, :], acc,
             mask=mask_m[:, None] & (offs_r[None, :] < stride_t))


@triton.jit
def _expand_kernel(t_ptr, b_ptr, rows_ptr, starts_ptr, lora_ptr, ranks_ptr, y_ptr, N, R,
                   stride_t, stride_bl, stride_bn, stride_y,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                   PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    s = tl.program_id(0)
    mb = tl.program_id(1)
    nb = tl.program_id(2)
    first = tl.load(starts_ptr + s)
    n_rows = tl.load(starts_ptr + s + 1) - first
    if mb * BLOCK_M >= n_rows:
        return
    slot = tl.load(lora_ptr + s)
    rank = tl.load(ranks_ptr + slot)
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_R)
    mask_m = offs_m < n_rows
    mask_n = offs_n < N
    rows = tl.load(rows_ptr + first + offs_m, mask=mask_m, other=0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        mask_r = r0 + offs_r < rank
        tb = tl.load(t_ptr + (first + offs_m)[:, None] * stride_t + (r0 + offs_r)[None, :],
                     mask=mask_m[:, None] & mask_r[None, :], other=0.0)
        bb = tl.load(b_ptr + slot * stride_bl + offs_n[None, :] * stride_bn + (r0 + offs_r)[:, None],
                     mask=mask_n[None, :] & mask_r[:, None], other=0.0)
        acc += dot(tb.to(bb.dtype), bb, PRECISION, UPCAST)
    y_ptrs = y_ptr + rows[:, None] * stride_y + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0)
    tl.store(y_ptrs, (y.to(tl.float32) + acc).to(y_ptr.dtype.element_ty), mask=mask)


def _max_rows(seg_starts: torch.Tensor) -> int:
    return int((seg_starts[1:] - seg_starts[:-1]).max()) if seg_starts.numel() > 1 else 0


def sgmv_shrink(x: torch.Tensor, a_buffer: torch.Tensor, rows: torch.Tensor, seg_starts: torch.Tensor,
                seg_lora: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    """t [len(rows), R] float32 = x[rows] @ A^T per segment (layout above)."""
    assert x.stride(1) == 1 and a_buffer.stride(2) == 1
    L, R, K = a_buffer.shape
    t = torch.zeros(rows.shape[0], R, dtype=torch.float32, device=x.device)
    S, M = seg_lora.shape[0], _max_rows(seg_starts)
    if S == 0 or M == 0:
        return t
    BLOCK_M, BLOCK_R, BLOCK_K = 16, 16, 64
    grid = (S, triton.cdiv(M, BLOCK_M), triton.cdiv(R, BLOCK_R))
    _shrink_kernel[grid](x, a_buffer, rows, seg_starts, seg_lora, ranks, t, K,
                         x.stride(0), a_buffer.stride(0), a_buffer.stride(1), t.stride(0),
                         BLOCK_M=BLOCK_M, BLOCK_R=BLOCK_R, BLOCK_K=BLOCK_K,
                         PRECISION=dot_precision(x.dtype), UPCAST=INTERPRETED)
    return t


def sgmv_expand(t: torch.Tensor, b_buffer: torch.Tensor, rows: torch.Tensor, seg_starts: torch.Tensor,
                seg_lora: torch.Tensor, ranks: torch.Tensor, y: torch.Tensor) -> None:
    """y[rows[j]] += t[j] @ B^T per segment, in place (y: columns contiguous, any row stride)."""
    assert y.stride(1) == 1 and b_buffer.stride(2) == 1
    L, N, R = b_buffer.shape
    S, M = seg_lora.shape[0], _max_rows(seg_starts)
    if S == 0 or M == 0:
        return
    BLOCK_M, BLOCK_N, BLOCK_R = 16, 64, 16
    grid = (S, triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    _expand_kernel[grid](t, b_buffer, rows, seg_starts, seg_lora, ranks, y, N, R,
                         t.stride(0), b_buffer.stride(0), b_buffer.stride(1), y.stride(0),
                         BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_R=BLOCK_R,
                         PRECISION=dot_precision(y.dtype), UPCAST=INTERPRETED)
