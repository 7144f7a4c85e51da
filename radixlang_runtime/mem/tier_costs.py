"""TierCosts: measured seconds per token of recomputing (prefill) and of loading from each tier (torch-free).

A tier must never make a request slower than recomputing it: while a tier's measured load cost per token
exceeds the prefill's, fetches skip it (counted in `skipped`), except every PROBE_EVERY-th ask, which
loads anyway to keep the measurement current (a disk that got faster, a Redis that recovered). Costs are
exponential moving averages; before both are measured a tier is always tried.
"""

from __future__ import annotations

from typing import Optional

ALPHA = 0.2
PROBE_EVERY = 32


class TierCosts:
    def __init__(self) -> None:
        self.prefill_s_per_token: Optional[float] = None
        self.load_s_per_token: dict[str, Optional[float]] = {"l2": None, "l3": None}
        self.skipped = {"l2": 0, "l3": 0}
        self._asks = {"l2": 0, "l3": 0}

    @staticmethod
    def _ema(old: Optional[float], new: float) -> float:
        return new if old is None else old + ALPHA * (new - old)

    def note_prefill(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self.prefill_s_per_token = self._ema(self.prefill_s_per_token, seconds / tokens)

    def note_load(self, tier: str, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds >= 0:
            self.load_s_per_token[tier] = self._ema(self.load_s_per_token[tier], seconds / tokens)

    def worth(self, tier: str) -> bool:
        """Whether a fetch should read this tier now."""
        self._asks[tier] += 1
        p, cost = self.prefill_s_per_token, self.load_s_per_token[tier]
        if p is None or cost is None or cost <= p or self._asks[tier] % PROBE_EVERY == 0:
            return True
        self.skipped[tier] += 1
        return False

    def cheaper(self, tier: str) -> bool:
        """Whether loading from this tier is measured no slower than recomputing (or not yet measured);
        unlike `worth`, no ask is counted and no probe is due (retraction's swap-out decision)."""
        p, cost = self.prefill_s_per_token, self.load_s_per_token[tier]
        return p is None or cost is None or cost <= p

    def stats(self) -> dict:
        return {"prefill_s_per_token": self.prefill_s_per_token, "load_s_per_token": dict(self.load_s_per_token),
                "skipped": dict(self.skipped)}
