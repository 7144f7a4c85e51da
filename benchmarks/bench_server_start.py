"""Server start: `launch_server` from process start to the first /health 200, per checkout.

Each start runs from its tree's root with PYTHONPATH=.:kernels (so an older checkout can be set beside this one),
on a free port, with the given server flags; --rounds repeats the trees interleaved (A B A B ...) against a
loaded machine's drift. Reported per start: wall seconds to /health 200, the CPU seconds the server's process tree
(HTTP process, scheduler, detokenizer) spent until then (a shared machine's load stretches the wall time, much
less the CPU time), and the 1-minute load average when it began; then the medians per tree.

    python benchmarks/bench_server_start.py --trees /path/to/old,. --rounds 5
    python benchmarks/bench_server_start.py --rounds 3 -- --dtype float32 --max-total-tokens 8192
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import httpx
import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import free_port, interleaved_trees  # noqa: E402

START_TIMEOUT_S = 600



def start_once(tree: str, flags: list[str]) -> dict:
    """One start of the server in `tree`: wall and process-tree CPU seconds until /health answers 200."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": ".:kernels"}
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile("w+") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "radixlang_runtime.launch_server", "--port", str(port),
                                 *flags], cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"{tree}: the server exited with {proc.returncode}:\n{log.read()[-3000:]}")
                if time.perf_counter() - t0 > START_TIMEOUT_S:
                    raise RuntimeError(f"{tree}: no /health 200 within {START_TIMEOUT_S} s")
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            wall = time.perf_counter() - t0
            root = psutil.Process(proc.pid)
            cpu = sum(sum(p.cpu_times()[:2]) for p in [root, *root.children(recursive=True)])
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    return {"wall": wall, "cpu": cpu, "load": load}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", default=".", help="comma-separated checkout roots, each run from its root")
    ap.add_argument("--rounds", type=int, default=3, help="the trees start interleaved this many times")
    ap.add_argument("flags", nargs="*", help="server flags (after --), the same for every tree")
    a = ap.parse_args()
    trees = [os.path.abspath(t) for t in a.trees.split(",")]
    interleaved_trees(trees, a.rounds, lambda t: start_once(t, a.flags),
                      f"starts, flags {' '.join(a.flags) or '(defaults)'}")


if __name__ == "__main__":
    main()
