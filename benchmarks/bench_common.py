"""Helpers the benchmarks share: run a measurement in its own process, and percentiles."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any, Callable


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
