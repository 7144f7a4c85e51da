"""GGUF block linears on CPU (gemv_kquant.c) against the dequantized float path, per block type.

For each type of quant_ops.GGUF_TYPES: a [N, K] weight as the file's blocks (random valid blocks), x [M, K]
bf16. Timed (the fastest of --reps calls, after warm-up): gguf_kq_gemv on the blocks (int8 activations);
torch F.linear on the dequantized weight in bf16 and in float32 (what --quantization none holds); and the
larger-batch paths on --rows rows (default 64): gguf_kq_gemm (gemm_kquant.c, the int8 GEMM bf16 batches run up to
KQ_GEMM_MAX_M rows) and gguf_dequant_rows tiles + a bf16 GEMM (gguf_block_linear.GGUFBlockLinear's path above it).
Reported: ms per call, the blocks' bytes, and GB/s of weight bytes read per call for the decode kernel.

    PYTHONPATH=kernels:. python kernels/benchmarks/bench_gguf_gemv.py [--n 4096] [--k 4096] [--m 1] [--rows 64]
        [--reps 20] [--types Q4_K,Q6_K]
"""

from __future__ import annotations

import argparse
import json
import time


def _ms(f, reps: int) -> float:
    for _ in range(3):
        f()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3  # the fastest call: the machine's other load only ever adds time


def main() -> None:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from radixlang_kernels import cpu_ops, quant_ops
    from radixlang_kernels.cpu_caps import detect
    from radixlang_kernels.testing import random_gguf_blocks
    from radixlang_runtime.model.layers.gguf_block_linear import GGUFBlockLinear

    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--m", type=int, default=1)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--types", default=",".join(quant_ops.GGUF_TYPES))
    a = p.parse_args()
    if cpu_ops.load() is None:
        print("no C kernel library (no compiler): nothing to measure")
        return
    N, K, M = a.n, a.k, a.m
    print(f"# isa {detect().isa}, threads {torch.get_num_threads()}, N {N} K {K} M {M}")
    x = torch.randn(M, K).to(torch.bfloat16)
    x64 = torch.randn(a.rows, K).to(torch.bfloat16)
    for fmt in a.types.split(","):
        blocks = torch.from_numpy(random_gguf_blocks(fmt, N, K, 0.02, np.random.default_rng(0)))
        w32 = quant_ops.gguf_dequant_rows(blocks, fmt, K, torch.float32)
        w16 = w32.to(torch.bfloat16)
        x32 = x.float()
        kq = _ms(lambda: quant_ops.gguf_kq_gemv(x, blocks, fmt), a.reps)
        d16 = _ms(lambda: F.linear(x, w16), a.reps)
        d32 = _ms(lambda: F.linear(x32, w32), a.reps)
        lin = GGUFBlockLinear([(blocks, fmt)], K, None, torch.bfloat16)
        gemm = _ms(lambda: quant_ops.gguf_kq_gemm(x64, blocks, fmt), max(3, a.reps // 4))
        tiles = _ms(lambda: lin._part(x64, blocks, fmt), max(3, a.reps // 4))  # above the kernels' rows
        nbytes = blocks.numel()
        row = {"type": fmt, "block_bytes": nbytes, "kq_ms": round(kq, 3), "kq_GBps": round(nbytes / kq / 1e6, 1),
               "bf16_dense_ms": round(d16, 3), "f32_dense_ms": round(d32, 3), "rows": a.rows,
               "int8_gemm_ms": round(gemm, 3), "tiles_ms": round(tiles, 3)}
        print(json.dumps(row))


if __name__ == "__main__":
    main()
