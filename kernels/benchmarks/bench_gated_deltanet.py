"""Gated DeltaNet decode, one token of B requests: gdn_ops.gdn_conv_update + gdn_decode (gated_deltanet.c, the
states read and written in place at their slots) against the torch form (reference.gdn_decode_ref: the states
gathered, the convolution and the delta rule in torch ops, scattered back; the runtime's torch path), medians of
--iters calls, A and B interleaved call by call (a shared machine's load hits both alike); float32 state, float32
or bf16 channels. Shapes: --shape tiny (tests' checkpoint: Hk 2, Hv 4, Dk 16, Dv 8), qwen3_next (Hk 16, Hv 32,
Dk 128, Dv 128: one layer of Qwen3-Next-80B-A3B), qwen3_5 (Hk 16, Hv 16, Dk 128, Dv 128).

    python kernels/benchmarks/bench_gated_deltanet.py [--shape qwen3_next] [--batch 1 8] [--iters 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from radixlang_kernels import cpu_ops, gdn_ops
from radixlang_kernels.reference import gdn_decode_ref

SHAPES = {"tiny": (2, 4, 16, 8), "qwen3_next": (16, 32, 128, 128), "qwen3_5": (16, 16, 128, 128)}


def interleaved_ms(a, b, iters: int) -> tuple[float, float]:
    a(), b()
    ta, tb = [], []
    for _ in range(iters):
        for fn, out in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(ta) * 1e3, statistics.median(tb) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), nargs="+", default=["tiny", "qwen3_next"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    if cpu_ops.load() is None:
        raise SystemExit("no C kernel library on this machine")
    dtype = getattr(torch, a.dtype)
    for name in a.shape:
        Hk, Hv, Dk, Dv = SHAPES[name]
        C, K = 2 * Hk * Dk + Hv * Dv, 4
        for B in a.batch:
            N = 2 * B + 1
            x = torch.randn(B, C).to(dtype)
            conv, w = torch.randn(N, C, K - 1).to(dtype), (0.3 * torch.randn(C, K)).to(dtype)
            g, beta = -torch.rand(B, Hv), torch.rand(B, Hv)
            state, slots = torch.randn(N, Hv, Dk, Dv), torch.randperm(N)[:B]

            def c_kernel():
                return gdn_ops.gdn_decode(gdn_ops.gdn_conv_update(x, conv, w, slots), g, beta, state, slots, Hk, Dk)

            def torch_ops():
                return gdn_decode_ref(x, conv, w, g, beta, state, slots, Hk)

            c_ms, t_ms = interleaved_ms(c_kernel, torch_ops, a.iters)
            print(f"{name} {a.dtype}: B {B}, Hk {Hk}, Hv {Hv}, Dk {Dk}, Dv {Dv}: C {c_ms:.3f} ms, torch {t_ms:.3f} ms "
                  f"({t_ms / c_ms:.1f}x)")


if __name__ == "__main__":
    main()
