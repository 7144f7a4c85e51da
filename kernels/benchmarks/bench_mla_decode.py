"""Multi-head latent attention decode, absorbed form: cpu_ops.mla_decode (mla_decode.c, the latent entries read
in place) against torch (the entries gathered, then SDPA of the H heads over them, as mla_attention.py's torch
path), medians of --iters calls, bf16 and float32; shuffled slots.

    python kernels/benchmarks/bench_mla_decode.py [--batch 4] [--heads 16] [--latent 256] [--rope 32] [--len 512]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from radixlang_kernels import cpu_ops


def median_ms(fn, iters: int) -> float:
    fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--latent", type=int, default=256)
    ap.add_argument("--rope", type=int, default=32)
    ap.add_argument("--len", type=int, default=512)
    ap.add_argument("--iters", type=int, default=30)
    a = ap.parse_args()
    if cpu_ops.load() is None:
        raise SystemExit("no C kernel library on this machine")
    B, H, C, R, L = a.batch, a.heads, a.latent, a.rope, a.len
    N, scale = 8 * B * L, (C + R) ** -0.5
    table = torch.stack([torch.randperm(N)[:L] for _ in range(B)])
    rows, lens = torch.arange(B), torch.full((B,), L)
    for dtype in (torch.float32, torch.bfloat16):
        pool, q = torch.randn(N, C + R).to(dtype), torch.randn(B, H, C + R).to(dtype)

        def c_kernel():
            return cpu_ops.mla_decode(q, pool, table, rows, lens, C, scale)

        def torch_sdpa():
            kv = pool.index_select(0, table.reshape(-1)).view(B, 1, L, C + R)
            return F.scaled_dot_product_attention(q.unsqueeze(1), kv, kv[..., :C], scale=scale).squeeze(1)

        diff = (c_kernel().float() - torch_sdpa().float()).abs().max().item()
        print(f"{str(dtype).replace('torch.', '')}: B {B}, H {H}, C {C}, R {R}, L {L}: mla_decode "
              f"{median_ms(c_kernel, a.iters):.2f} ms, torch gather + SDPA {median_ms(torch_sdpa, a.iters):.2f} ms "
              f"(max |diff| {diff:.1e})")


if __name__ == "__main__":
    main()
