"""Helpers the benchmarks share: run a measurement in its own process, a server (or router) child process that is
up once its /health answers, and percentiles."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import tempfile
import time
from typing import Any, Callable, Optional

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout the benchmarks belong to


def in_child(target: Callable[..., None], *args: Any) -> Any:
    """Run target(*args, queue) in a fresh spawned process (no shared thread pools, allocator state or
    warm caches between systems) and return what it put on the queue."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    res = q.get()
    p.join()
    return res


def percentile(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) by rank, nearest-rank style; 0.0 for an empty list."""
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def interleaved_trees(trees: list[str], rounds: int, once: Callable[[str], dict], what: str) -> dict[str, dict]:
    """once(tree) for every tree, `rounds` times interleaved (A B A B ...: a loaded machine's drift falls on each
    tree alike); prints each run's wall / cpu / load and returns each tree's medians of them."""
    res: dict[str, list[dict]] = {t: [] for t in trees}
    for r in range(rounds):
        for t in trees:
            m = once(t)
            res[t].append(m)
            label = f" ({m['label']})" if "label" in m else ""
            print(f"round {r + 1} {t}{label}: wall {m['wall']:.1f} s, cpu {m['cpu']:.1f} s, load {m['load']:.1f}",
                  flush=True)
    print(f"\nmedians of {rounds} {what}")
    med = {t: {k: statistics.median(m[k] for m in res[t]) for k in ("wall", "cpu", "load")} for t in trees}
    for t, m in med.items():
        print(f"{t}: wall {m['wall']:.1f} s, cpu {m['cpu']:.1f} s (load {m['load']:.1f})")
    return med


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process (server or router) with its log; `up` waits (bounded) for /health."""

    def __init__(self, name: str, cmd: list[str], port: int, cores: Optional[list[int]] = None):
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        if cores:
            cmd = ["taskset", "-c", ",".join(map(str, cores)), *cmd]
            env["OMP_NUM_THREADS"] = str(len(cores))
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"bench_{name}_", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def up(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; "
                                   f"log {self.log.name}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not healthy after {timeout} s; log {self.log.name}:\n{self.tail()}")

    def tail(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
