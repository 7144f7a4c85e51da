"""The Mamba2 decode entry points of the op table (csrc/cpu/mamba2.c), with cpu_ops.py's conventions (its load()
and status check): mamba2_decode runs one token of each request through the SSD recurrence over a state pool in
place. The convolution before it is gdn_ops.gdn_conv_update (with the conv bias). The library must be loaded (the
callers choose this path only then)."""

from __future__ import annotations

import torch

from radixlang_kernels.cpu_ops import check_status, loaded


def mamba2_decode(xbc: torch.Tensor, dt: torch.Tensor, dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor,
                  state: torch.Tensor, slots: torch.Tensor, n_groups: int) -> torch.Tensor:
    """One token of B requests (mamba2.c): xbc [B, *] float32 (the convolved x [H, P], B and C [G, Nst] channels,
    rows may be strided), dt [B, H] and dt_bias [H] raw (dt = softplus(dt + dt_bias) is taken here, in bf16 when
    both are bf16 as torch's bf16 ops round it, else in float32), A [H] (= -exp(A_log)) and D [H], state
    [N, H, P, Nst] float32 (one layer's states, contiguous) updated in place at slots [B] int64 -> y [B, H, P]
    float32 (with the D skip). Head h reads group h // (H / n_groups)."""
    lib = loaded()
    if lib is None:
        raise RuntimeError("the C kernels are not loaded (radixlang_kernels.cpu_ops.load()): no Mamba2 ops")
    B = xbc.shape[0]
    N, H, P, Nst = state.shape
    assert xbc.dtype == state.dtype == torch.float32
    assert xbc.shape[1] >= H * P + 2 * n_groups * Nst
    if xbc.stride(1) != 1:
        xbc = xbc.contiguous()
    bf16 = dt.dtype == dt_bias.dtype == torch.bfloat16
    if not bf16:
        dt, dt_bias = dt.float(), dt_bias.float()
    if dt.stride(1) != 1:
        dt = dt.contiguous()
    dt_bias, A, D = dt_bias.contiguous(), A.float().contiguous(), D.float().contiguous()
    out = torch.empty(B, H, P, dtype=torch.float32)
    name = "mamba2_decode_bf16" if bf16 else "mamba2_decode_f32"
    rc = getattr(lib, name)(xbc.data_ptr(), xbc.stride(0), dt.data_ptr(), dt.stride(0), dt_bias.data_ptr(),
                            A.data_ptr(), D.data_ptr(), state.data_ptr(), slots.data_ptr(), B, H, P, n_groups, Nst,
                            N, out.data_ptr())
    check_status(rc, name)
    return out
