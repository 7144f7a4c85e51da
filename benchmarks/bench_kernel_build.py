"""The C kernel library's first build (a fresh cache, as on a new machine's first start), per checkout.

Each build runs in a child process from its tree's root with PYTHONPATH=kernels and an empty
RADIXLANG_CACHE_DIR, for the instruction set this CPU reports (or the one RADIXLANG_CPU_MASK leaves); --rounds
repeats the trees interleaved (A B A B ...) against a loaded machine's drift. Reported per build: wall
seconds, the compilers' CPU seconds, and the 1-minute load average when it began; then the medians per tree.

    python benchmarks/bench_kernel_build.py --trees /path/to/old,. --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import interleaved_trees  # noqa: E402

BUILD = """
import json, os, resource, time
from radixlang_kernels.cpu_caps import detect
from radixlang_kernels.op_table import build_library
caps = detect()
t0 = time.perf_counter()
lib = build_library(caps)
wall = time.perf_counter() - t0
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"ok": lib is not None, "isa": caps.isa, "wall": wall, "cpu": r.ru_utime + r.ru_stime}))
"""


def build_once(tree: str) -> dict:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PYTHONPATH": "kernels", "RADIXLANG_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, "-c", BUILD], cwd=tree, env=env, capture_output=True, text=True,
                             timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: the build process exited with {out.returncode}:\n{out.stderr[-3000:]}")
    m = json.loads(out.stdout.strip().splitlines()[-1])
    if not m["ok"]:
        raise RuntimeError(f"{tree}: the kernels did not build:\n{out.stderr[-3000:]}")
    return {**m, "label": m["isa"], "load": load}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", default=".", help="comma-separated checkout roots, each run from its root")
    ap.add_argument("--rounds", type=int, default=3, help="the trees build interleaved this many times")
    a = ap.parse_args()
    trees = [os.path.abspath(t) for t in a.trees.split(",")]
    interleaved_trees(trees, a.rounds, build_once, f"builds, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
