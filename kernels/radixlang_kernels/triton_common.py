"""Pieces the Triton attention kernels share: scores with the optional soft-cap, one online-softmax
step, the loop over a range of paged positions, and the dot product that stays exact on the CPU
interpreter.

Triton's CPU interpreter multiplies bfloat16 blocks wrongly (numpy has no bfloat16), so interpreted
runs (the tests on CPU) upcast both operands to float32; compiled GPU runs feed tl.dot the input dtype
(tensor cores, float32 accumulation), and float32 inputs use exact "ieee" products, not TF32.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def dot_precision(dtype) -> str:
    import torch

    return "ieee" if dtype == torch.float32 else "tf32"  # tf32 is ignored for half inputs


@triton.jit
def dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def scores(q, k, visible, scale, soft_cap, SOFT_CAP: tl.constexpr, PRECISION: tl.constexpr,
           UPCAST: tl.constexpr):
    """q [M, D], k [N, D] -> float32 [M, N] scaled scores (soft-capped: c * tanh(s / c)), -inf where
    not visible."""
    qk = dot(q, tl.trans(k), PRECISION, UPCAST) * scale
    if SOFT_CAP:
        qk = soft_cap * (1.0 - 2.0 / (tl.exp(2.0 * qk / soft_cap) + 1.0))
    return tl.where(visible, qk, float("-inf"))


@triton.jit
def softmax_step(qk, v, m_i, l_i, acc, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Fold one block of scores qk [M, N] and values v [N, D] into the running max m_i [M], sum l_i [M]
    and unnormalised output acc [M, D]. Rows that have seen no key yet stay at zero."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, PRECISION, UPCAST)
    return m_new, l_i, acc


@triton.jit
def attend_paged(q, m_i, l_i, acc, k_ptr, v_ptr, rt_ptr, row, stride_rt, kv_off, stride_ks, start, end, offs_d,
                 mask_d, scale, soft_cap, BLOCK_N: tl.constexpr, SOFT_CAP: tl.constexpr, PRECISION: tl.constexpr,
                 UPCAST: tl.constexpr, q_pos=None, window=0, WINDOW: tl.constexpr = False, chunk=1,
                 CHUNK: tl.constexpr = False):
    """Fold positions start .. end - 1 of table row `row` (slots rt_ptr[row * stride_rt + pos]; K / V of
    one KV head at k_ptr / v_ptr + kv_off + slot * stride_ks + d) into the online softmax of q [M, D]
    (kv_off int64: head * stride passes 2^31 once a layer's pool holds 2^31 elements, e.g. 8 KV heads x
    2M slots x 128 lanes):
    blocks of BLOCK_N positions, every one visible to every row of q; with WINDOW, only the positions
    > q_pos - window of each row (q_pos [M]: the rows' positions; sliding-window attention); with CHUNK, only
    the positions >= q_pos - q_pos % chunk of each row (chunked local attention: the row's own chunk)."""
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        slots = tl.load(rt_ptr + row * stride_rt + offs_n, mask=mask_n, other=0)
        off = kv_off + slots[:, None] * stride_ks + offs_d[None, :]
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_ptr + off, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        v = tl.load(v_ptr + off, mask=kv_mask, other=0.0)
        visible = mask_n[None, :]
        if WINDOW:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        if CHUNK:
            visible = visible & (offs_n[None, :] >= q_pos[:, None] - q_pos[:, None] % chunk)
        qk = scores(q, k, visible, scale, soft_cap, SOFT_CAP, PRECISION, UPCAST)  # [M, BLOCK_N]
        m_i, l_i, acc = softmax_step(qk, v, m_i, l_i, acc, PRECISION, UPCAST)
    return m_i, l_i, acc
