"""The Gated DeltaNet's entry points of the op table (csrc/cpu/gated_deltanet.c), with cpu_ops.py's conventions (its
load() and status check): gdn_conv_update, gdn_decode, gdn_prefill decode and prefill over a state pool in place;
gdn_conv_prefill, gdn_gates, gdn_gated_norm, sigmoid_mul are the batch-invariant pieces of the deterministic mode.
The library must be loaded (the callers choose these paths only then)."""

from __future__ import annotations

from typing import Optional

import torch

from radixlang_kernels.cpu_ops import check_status, loaded, opt_ptr
from radixlang_kernels.op_table import OpTable


def _table() -> OpTable:
    lib = loaded()
    if lib is None:
        raise RuntimeError("the C kernels are not loaded (radixlang_kernels.cpu_ops.load()): no Gated DeltaNet ops")
    return lib


def gdn_conv_update(x: torch.Tensor, conv: torch.Tensor, weight: torch.Tensor, slots: torch.Tensor,
                    bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The causal depthwise convolution of the Gated DeltaNet and the Mamba2 mixer, one new row per request
    (gated_deltanet.c): x [B, C] (rows may be strided), conv [N, C, K - 1] (one layer's windows, contiguous) updated
    in place at slots [B] int64, weight [C, K], bias [C] or None; all bf16 or all float32 -> silu(convolution)
    [B, C] float32 (bf16: rounded as torch's bf16 ops)."""
    B, C = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    assert conv.dtype == weight.dtype == x.dtype
    if bias is not None:
        assert bias.dtype == x.dtype
        bias = bias.contiguous()
    out = torch.empty(B, C, dtype=torch.float32)
    name = "gdn_conv_update_bf16" if x.dtype == torch.bfloat16 else "gdn_conv_update_f32"
    rc = getattr(_table(), name)(x.data_ptr(), x.stride(0), conv.data_ptr(), weight.contiguous().data_ptr(),
                                 opt_ptr(bias), slots.data_ptr(), B, C, weight.shape[1], conv.shape[0], out.data_ptr())
    check_status(rc, name)
    return out


def gdn_decode(qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
               num_k_heads: int, k_head_dim: int) -> torch.Tensor:
    """The gated delta rule for one token of B requests (gated_deltanet.c): qkv [B, *] float32 (the convolved q
    [Hk, Dk], k [Hk, Dk], v [Hv, Dv] channels, rows may be strided), g / beta [B, Hv] float32, state [N, Hv, Dk, Dv]
    float32 (one layer's states, contiguous) updated in place at slots [B] int64 -> o [B, Hv, Dv] float32.
    q and k are L2-normalised here and q scaled by Dk ** -0.5; value head h reads key head h // (Hv / Hk)."""
    B = qkv.shape[0]
    N, Hv, Dk, Dv = state.shape
    assert qkv.dtype == g.dtype == beta.dtype == state.dtype == torch.float32 and Dk == k_head_dim
    if qkv.stride(1) != 1:
        qkv = qkv.contiguous()
    out = torch.empty(B, Hv, Dv, dtype=torch.float32)
    rc = _table().gdn_decode_f32(qkv.data_ptr(), qkv.stride(0), g.contiguous().data_ptr(), beta.contiguous().data_ptr(),
                             state.data_ptr(), slots.data_ptr(), B, num_k_heads, Hv, Dk, Dv, N, out.data_ptr())
    check_status(rc, "gdn_decode_f32")
    return out


def gdn_prefill(qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
                starts: torch.Tensor, lens: torch.Tensor, num_k_heads: int, k_head_dim: int) -> torch.Tensor:
    """The gated delta rule token after token over segments (gated_deltanet.c): segment r is rows starts[r] ..
    starts[r] + lens[r] - 1 of qkv [T, *] float32 (as gdn_decode's rows), run from state slot slots[r] (int64
    each); g / beta [T, Hv] float32; state [N, Hv, Dk, Dv] float32 updated in place -> o [T, Hv, Dv] float32."""
    T = qkv.shape[0]
    N, Hv, Dk, Dv = state.shape
    assert qkv.dtype == g.dtype == beta.dtype == state.dtype == torch.float32 and Dk == k_head_dim
    if qkv.stride(1) != 1:
        qkv = qkv.contiguous()
    out = torch.empty(T, Hv, Dv, dtype=torch.float32)
    rc = _table().gdn_prefill_f32(qkv.data_ptr(), qkv.stride(0), g.contiguous().data_ptr(),
                                  beta.contiguous().data_ptr(), state.data_ptr(), slots.data_ptr(), starts.data_ptr(),
                                  lens.data_ptr(), lens.shape[0], num_k_heads, Hv, Dk, Dv, N, out.data_ptr())
    check_status(rc, "gdn_prefill_f32")
    return out


def gdn_conv_prefill(x: torch.Tensor, conv: torch.Tensor, weight: torch.Tensor, slots: torch.Tensor,
                     starts: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """gdn_conv_update's arithmetic token after token over segments (gated_deltanet.c): segment r is rows
    starts[r] .. starts[r] + lens[r] - 1 of x [T, C] from the window at slots[r] of conv [N, C, K - 1] (read, then
    written back holding the segment's last K - 1 inputs); int64 each; all bf16 or all float32 -> [T, C] float32."""
    T, C = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty(T, C, dtype=torch.float32)
    name = "gdn_conv_prefill_bf16" if x.dtype == torch.bfloat16 else "gdn_conv_prefill_f32"
    rc = getattr(_table(), name)(x.data_ptr(), x.stride(0), conv.data_ptr(), weight.contiguous().data_ptr(),
                             slots.data_ptr(), starts.data_ptr(), lens.data_ptr(), lens.shape[0], C, weight.shape[1],
                             conv.shape[0], out.data_ptr())
    check_status(rc, name)
    return out


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet's gates per element, one at a time (gated_deltanet.c): a, b [T, H] -> (g = -exp(A_log)
    softplus(a + dt_bias), beta = sigmoid(b)), float32 [T, H] each."""
    a, b = a.float().contiguous(), b.float().contiguous()
    T, H = a.shape
    g, beta = torch.empty(T, H), torch.empty(T, H)
    _table().gdn_gates_f32(a.data_ptr(), b.data_ptr(), A_log.float().contiguous().data_ptr(),
                       dt_bias.float().contiguous().data_ptr(), T, H, g.data_ptr(), beta.data_ptr())
    return g, beta


def gdn_gated_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * rms_norm(x) * silu(z) one row at a time (gated_deltanet.c): x, z [R, D] -> float32 [R, D]."""
    x, z = x.float().contiguous(), z.float().contiguous()
    R, D = x.shape
    out = torch.empty(R, D)
    _table().gdn_gated_norm_f32(x.data_ptr(), z.data_ptr(), weight.float().contiguous().data_ptr(), R, D, eps,
                            out.data_ptr())
    return out


def sigmoid_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate) one element at a time (gated_deltanet.c) -> float32, x's shape."""
    out = x.float().contiguous().clone()
    gate = gate.float().contiguous()
    _table().sigmoid_mul_f32(out.data_ptr(), gate.data_ptr(), out.numel())
    return out
