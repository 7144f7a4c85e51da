"""Mamba2 decode, one token of B requests through one layer's convolution and SSD recurrence:
gdn_ops.gdn_conv_update (with the conv bias) + mamba2_ops.mamba2_decode (gated_deltanet.c, mamba2.c: the states
read and written in place at their slots) against the torch form (reference.mamba2_decode_ref: the states
gathered, the convolution, softplus and recurrence in torch ops, scattered back; the runtime's torch path), medians
of --iters calls, A and B interleaved call by call (a shared machine's load hits both alike); float32 state,
float32 or bf16 channels. The projections and the gated norm (torch on both paths) are not timed. Shapes (heads H,
head_dim P, d_state N, groups G): --shape tiny (the tests' checkpoint: H 4, P 16, N 8, G 2), granite_4_h_tiny
(H 48, P 64, N 128, G 1: one Mamba2 layer of Granite-4.0-H-Tiny), nemotron_h_8b (H 128, P 64, N 128, G 8).

    python kernels/benchmarks/bench_mamba2.py [--shape granite_4_h_tiny] [--batch 1 8] [--iters 30]
"""

from __future__ import annotations

import argparse

import torch
from bench_gated_deltanet import interleaved_ms

from radixlang_kernels import cpu_ops, gdn_ops, mamba2_ops
from radixlang_kernels.reference import mamba2_decode_ref

SHAPES = {"tiny": (4, 16, 8, 2), "granite_4_h_tiny": (48, 64, 128, 1), "nemotron_h_8b": (128, 64, 128, 8)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), nargs="+", default=["granite_4_h_tiny"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--iters", type=int, default=30)
    a = ap.parse_args()
    if cpu_ops.load() is None:
        raise SystemExit("no C kernel library on this machine")
    dtype = getattr(torch, a.dtype)
    for name in a.shape:
        H, P, Nst, G = SHAPES[name]
        C, K = H * P + 2 * G * Nst, 4
        for B in a.batch:
            N = 2 * B + 1
            x = torch.randn(B, C).to(dtype)
            conv, w = torch.randn(N, C, K - 1).to(dtype), (0.3 * torch.randn(C, K)).to(dtype)
            bias = (0.1 * torch.randn(C)).to(dtype)
            dt, dt_bias = torch.randn(B, H).to(dtype), torch.rand(H).to(dtype)
            A, D = -torch.exp(torch.rand(H)), torch.randn(H)
            state, slots = 0.1 * torch.randn(N, H, P, Nst), torch.randperm(N)[:B]

            def c_kernel():
                xbc = gdn_ops.gdn_conv_update(x, conv, w, slots, bias)
                return mamba2_ops.mamba2_decode(xbc, dt, dt_bias, A, D, state, slots, G)

            def torch_ops():
                return mamba2_decode_ref(x, conv, w, bias, dt, dt_bias, A, D, state, slots, G)

            c_ms, t_ms = interleaved_ms(c_kernel, torch_ops, a.iters)
            print(f"{name} {a.dtype}: B {B}, H {H}, P {P}, N {Nst}, G {G}: C {c_ms:.3f} ms, torch {t_ms:.3f} ms "
                  f"({t_ms / c_ms:.1f}x)")


if __name__ == "__main__":
    main()
