"""Per-linear timings of the GGUF int8 kernels on random blocks of a Q4_K_M file's shapes (SmolLM2-135M's):
gemv_q8.c's tiles (`gguf_q8_gemv`, up to 16 rows) against gemm_kquant.c on the same tiles (`gguf_q8_tiles_gemm`),
per row count: where the decode layer switches from one to the other (quant_ops.KQ_TILES_GEMM_MIN_M).

With --vs DIR, the GEMM of another source tree (a checkout of another revision) runs beside this one's in the
same process, calls interleaved round by round, so both see the same machine state (this VM's rates swing by
1.5x between seconds): a kernel change measured against its parent.

    OMP_NUM_THREADS=1 PYTHONPATH=kernels python benchmarks/bench_gguf_linears.py --rows 10,12,14,16
    OMP_NUM_THREADS=1 PYTHONPATH=kernels python benchmarks/bench_gguf_linears.py --rows 16,64 --vs /tmp/parent
    OMP_NUM_THREADS=1 PYTHONPATH=kernels python benchmarks/bench_gguf_linears.py --rows 64 --shapes Q6_K:4:1536
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from radixlang_kernels import cpu_ops, quant_ops
from radixlang_kernels.testing import random_gguf_blocks

# (format, N, K): gate / up, q / o, ffn_down (Q4_K and Q6_K), a third of the tied head, the head
SHAPES = [("Q5_0", 3072, 576), ("Q5_0", 576, 576), ("Q4_K", 576, 1536), ("Q6_K", 576, 1536), ("Q8_0", 16384, 576),
          ("Q8_0", 49152, 576)]


def best_ms(fn, calls: int) -> float:
    best = float("inf")
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def tiles_gemm_of(lib_path: str):
    """gguf_q8_tiles_gemm of the library at lib_path, loaded beside this process's own (RTLD_LOCAL)."""
    f = ctypes.CDLL(lib_path, mode=os.RTLD_LOCAL).gguf_q8_tiles_gemm
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int,
                  ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]

    def run(x: torch.Tensor, tiles: torch.Tensor, fmt: str, n: int, out: torch.Tensor) -> None:
        M, K = x.shape
        if f(x.data_ptr(), 1, tiles.data_ptr(), quant_ops.Q8_TILE_FORMATS[fmt][0], out.data_ptr(), 1, M, K, n, n):
            raise RuntimeError(f"{lib_path}: gguf_q8_tiles_gemm refused [{M}, {K}] x {fmt} [{n}, {K}]")
    return run


def other_library(tree: str) -> str:
    """The kernel library another source tree builds for this CPU (built there, in its own process)."""
    code = "from radixlang_kernels import cpu_ops; print(cpu_ops.load().path)"
    env = {**os.environ, "PYTHONPATH": os.path.join(tree, "kernels")}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    if res.returncode:
        raise SystemExit(f"{tree}: no kernel library: {res.stderr[-400:]}")
    return res.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="10,12,14,16", help="row counts (comma-separated)")
    ap.add_argument("--vs", help="another source tree: its gguf_q8_tiles_gemm beside this one's")
    ap.add_argument("--shapes", help="FMT:N:K,... instead of the file's (Q6_K:4:1536: mostly the activations' side)")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--calls", type=int, default=6, help="calls per round (the round's figure: their minimum)")
    args = ap.parse_args()
    lib = cpu_ops.load()
    if lib is None:
        raise SystemExit("no C compiler: the kernels are not built")
    rows = [int(r) for r in args.rows.split(",")]
    mine = tiles_gemm_of(lib.path)
    theirs = tiles_gemm_of(other_library(args.vs)) if args.vs else None
    print(f"{lib.path}, {torch.get_num_threads()} threads" + (f"; --vs {args.vs}" if args.vs else ""))
    rng = np.random.default_rng(0)
    shapes = SHAPES
    if args.shapes:
        shapes = [(f, int(n), int(k)) for f, n, k in (item.split(":") for item in args.shapes.split(","))]
    for fmt, N, K in shapes:
        tiles = quant_ops.gguf_q8_tiles(torch.from_numpy(random_gguf_blocks(fmt, N, K, 0.05, rng)), fmt)
        for M in rows:
            x = torch.randn(M, K).to(torch.bfloat16)
            out = torch.empty(M, N, dtype=torch.bfloat16)
            runs = {"gemm": lambda: mine(x, tiles, fmt, N, out)}
            if theirs is not None:
                runs["vs gemm"] = lambda: theirs(x, tiles, fmt, N, out)
            if M <= quant_ops.KQ_MAX_M:
                runs["gemv"] = lambda: quant_ops.gguf_q8_gemv(x, tiles, fmt, N)
            times: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(args.rounds):
                for name, fn in runs.items():
                    times[name].append(best_ms(fn, args.calls))
            med = {k: statistics.median(v) for k, v in times.items()}
            cols = "  ".join(f"{k} {v:.3f}" for k, v in med.items())
            ratio = f"  gemm / vs {med['gemm'] / med['vs gemm']:.3f}" if "vs gemm" in med else ""
            ratio += f"  gemm / gemv {med['gemm'] / med['gemv']:.2f}" if "gemv" in med else ""
            print(f"{fmt} [{N}, {K}] M={M}: {cols} ms (medians of {args.rounds} rounds){ratio}", flush=True)


if __name__ == "__main__":
    main()
