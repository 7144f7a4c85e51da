"""The LoRA deltas of one fused linear: the C segment kernel (cpu_ops.lora_shrink + lora_expand, one call each
for every adapter of the step) against the torch path (model/lora_linear.LoraLinear's: per adapter a row gather,
then per sub-projection two matmuls added into the output slice), float32 or bf16 (--dtype), on SmolLM2-135M's
projections (qkv_proj: K 576 -> q 576, k 192, v 192; gate_up_proj: 576 -> 1536, 1536; down_proj: 1536 -> 576), rank 16
on every sub-projection, M rows spread round-robin over 1 or 4 adapters (interleaved rows: a gather each).
Reports the fastest of --repeats timings of --iters calls (a loaded machine's noise only adds), in microseconds
per call. Prints one JSON object.

    python kernels/benchmarks/bench_lora_sgmv.py [--rows 1,4,16,64,256] [--rank 16] [--iters 200] [--repeats 5]
        [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

from radixlang_kernels import cpu_ops
from radixlang_kernels.cpu_caps import detect
from radixlang_kernels.op_table import pointer_array

LINEARS = {"qkv_proj": (576, [576, 192, 192]), "gate_up_proj": (576, [1536, 1536]), "down_proj": (1536, [576])}


def setup(K, parts, rank, adapters, M, g, dtype):
    x = torch.randn(M, K, generator=g).to(dtype)
    y = torch.randn(M, sum(parts), generator=g).to(dtype)
    w = []  # per adapter: [(offset, size, A [r, K], Bt [r, size])]
    for _ in range(adapters):
        off, ps = 0, []
        for n in parts:
            ps.append((off, n, (torch.randn(rank, K, generator=g) * 0.05).to(dtype),
                       (torch.randn(rank, n, generator=g) * 0.05).to(dtype)))
            off += n
        w.append(ps)
    groups = [torch.arange(i, M, adapters) for i in range(min(adapters, M))]
    return x, y, w, groups


def torch_path(x, y, w, groups):
    for lid, rows in enumerate(groups):
        xs = x[rows]
        for off, n, a, bt in w[lid]:
            y[rows, off:off + n] += (xs @ a.t()) @ bt


def kernel_args(w, groups, rank):
    rows = torch.cat(groups).to(torch.int64)
    starts = torch.tensor([0] + [int(sum(len(g) for g in groups[:i + 1])) for i in range(len(groups))])
    a = [torch.cat([p[2] for p in w[i]]).contiguous() for i in range(len(groups))]
    tasks, bts = [], []
    for s in range(len(groups)):
        for j, (off, n, _, bt) in enumerate(w[s]):
            tasks.append([s, j * rank, rank, off, n])
            bts.append(bt)
    ranks = torch.tensor([t.shape[0] for t in a], dtype=torch.int64)
    return (rows, starts, pointer_array([t.data_ptr() for t in a]), ranks, torch.tensor(tasks, dtype=torch.int64),
            pointer_array([t.data_ptr() for t in bts]), int(ranks.max()), (a, bts))


def kernel_path(x, y, args):
    rows, starts, a_ptrs, ranks, tasks, b_ptrs, width, _ = args
    t = torch.empty(rows.shape[0], width, dtype=torch.float32)
    cpu_ops.lora_shrink(x, rows, starts, a_ptrs, ranks, t)
    cpu_ops.lora_expand(t, rows, starts, tasks, b_ptrs, y)


def best_us(fn, iters, repeats):
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t0) / iters)
    return round(best * 1e6, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,4,16,64,256")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = ap.parse_args()
    if cpu_ops.load() is None:
        raise SystemExit("the CPU kernel library did not build (no compiler?)")
    g = torch.Generator().manual_seed(0)
    out = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "isa": detect().isa,
           "torch_threads": torch.get_num_threads(), "rank": a.rank, "dtype": a.dtype, "us_per_call": []}
    dtype = getattr(torch, a.dtype)
    tol = dict(rtol=1e-3, atol=1e-3) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    for name, (K, parts) in LINEARS.items():
        for adapters in (1, 4):
            for M in (int(m) for m in a.rows.split(",")):
                x, y, w, groups = setup(K, parts, a.rank, adapters, M, g, dtype)
                args = kernel_args(w, groups, a.rank)
                y1, y2 = y.clone(), y.clone()
                torch_path(x, y1, w, groups)
                kernel_path(x, y2, args)
                torch.testing.assert_close(y1.float(), y2.float(), **tol)
                out["us_per_call"].append({
                    "linear": name, "adapters": adapters, "rows": M,
                    "torch": best_us(lambda: torch_path(x, y, w, groups), a.iters, a.repeats),
                    "kernel": best_us(lambda: kernel_path(x, y, args), a.iters, a.repeats)})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
