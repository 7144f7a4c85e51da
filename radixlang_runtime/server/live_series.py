"""Recent history for the live view (/dashboard), kept in the HTTP process. Torch-free.

Fed by the TokenizerManager as results arrive (TTFT per request, ITL per streamed chunk, tokens and
finished requests) and sampled by /dashboard/state (KV split, queues). Everything is bounded: the
last WINDOW_S seconds, at most MAX_POINTS samples and MAX_LATENCIES latencies per kind.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Optional

WINDOW_S = 300.0
SAMPLE_EVERY_S = 1.0  # at most one point a second, however often the state is read
MAX_POINTS = 300  # 5 minutes
MAX_LATENCIES = 2048
PERCENTILES = (50, 90, 99)


def percentiles(xs: list[float]) -> dict[str, Optional[float]]:
    """Nearest-rank percentiles (None when empty)."""
    if not xs:
        return {f"p{q}": None for q in PERCENTILES}
    s = sorted(xs)
    return {f"p{q}": s[min(len(s) - 1, max(0, int(round(q / 100 * len(s) + 0.5)) - 1))] for q in PERCENTILES}


class LiveSeries:
    def __init__(self) -> None:
        self.ttft: deque[tuple[float, float]] = deque(maxlen=MAX_LATENCIES)  # (when, seconds)
        self.itl: deque[tuple[float, float]] = deque(maxlen=MAX_LATENCIES)
        self.tokens_total = 0
        self.finished_total = 0
        self.points: deque[dict[str, Any]] = deque(maxlen=MAX_POINTS)
        self._last = (time.monotonic(), 0, 0)  # (t, tokens_total, finished_total) at the last sample

    def on_tokens(self, created: float, last_token_at: Optional[float], now: float, n: int) -> None:
        """created / last_token_at / now: time.perf_counter() values, as the TokenizerManager keeps them."""
        t = time.monotonic()
        if last_token_at is None:
            self.ttft.append((t, now - created))
        else:
            self.itl.append((t, (now - last_token_at) / n))
        self.tokens_total += n

    def on_finish(self) -> None:
        self.finished_total += 1

    def sample(self, dashboard: dict[str, Any]) -> None:
        """Append a point from the scheduler's dashboard state (at most every SAMPLE_EVERY_S)."""
        now = time.monotonic()
        t0, tok0, fin0 = self._last
        if self.points and now - t0 < SAMPLE_EVERY_S:
            return
        dt = max(now - t0, 1e-6)
        kv, q = dashboard["kv"], dashboard["queues"]
        point = {"t": now, "tok_s": (self.tokens_total - tok0) / dt, "req_s": (self.finished_total - fin0) / dt,
                 "free": kv["free"], "evictable": kv["evictable"], "locked": kv["locked"], "private": kv["private"],
                 "waiting": q["waiting"], "running": q["running"], "forward_steps": q["forward_steps"]}
        self._last = (now, self.tokens_total, self.finished_total)
        self.points.append(point)

    def snapshot(self) -> dict[str, Any]:
        """The window's points (t relative to now, seconds, negative) and latency percentiles."""
        now = time.monotonic()
        pts = [{**p, "t": round(p["t"] - now, 3)} for p in self.points if now - p["t"] <= WINDOW_S]
        recent = lambda d: [v for when, v in d if now - when <= WINDOW_S]  # noqa: E731
        return {"points": pts, "ttft": percentiles(recent(self.ttft)), "itl": percentiles(recent(self.itl)),
                "tokens_total": self.tokens_total, "finished_total": self.finished_total}
