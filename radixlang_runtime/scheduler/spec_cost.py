"""StepCost: what a decode step of M rows costs on this machine, measured online (torch-free).

Speculation's keep-or-drop rule (drafter.trim_to_cost) needs c = b / a of a decode step's cost a + b * M
(M rows: the requests' own tokens plus the draft rows, verified as decode rows, model/runner.verify_as_decode).
The ratio is not a machine constant: the step's cost is not linear over 1..64 rows (weights streamed once at
small M, per-row compute at large M), so the slope that matters is the local one around the batch at hand,
and it differs between CPUs, dtypes and thread counts. So the scheduler reports every all-decode step
(Drafts.note_step: its request count, its rows, its cost: the smaller of its wall and process CPU times, as
wall time swells with other processes' load and CPU time with torch threads) and this fits t = a + b * M per
batch size regime (requests 1, 2-3, 4-7, 8-15, ...: the steps one regime sees span M = B .. B + its draft
rows, and batch sizes drifting as requests finish), by exponentially decayed least squares (DECAY per sample:
the machine's load and the context length drift) whose slope is pulled toward the prior's (b = prior * a) by
PRIOR_WEIGHT samples of one row's spread: with no samples, or samples all at one M (no slope to see), the
ratio is the prior (drafter.ROW_COST); with samples spread over M the measured slope wins.

Invariants: ratio() is in [0, MAX_RATIO] and equals the prior for a regime with no samples; record() is O(1)
and never raises on odd input (a negative or NaN time, a non-positive row count: ignored); no clock read here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DECAY = 0.97  # weight of the past per sample in a regime (~33 samples' memory)
PRIOR_WEIGHT = 4.0  # the prior slope's pull, in samples one row off the mean
MAX_RATIO = 1000.0  # b / a when the fit's intercept is ~0 or below (rows cost everything: drafts only if sure)
CLIP = 4.0  # a sample above CLIP x the prediction counts as CLIP x it (a descheduled thread, a GC pause)


@dataclass
class _Sums:
    """Decayed sums of one regime's samples (w: weights, m: rows, t: seconds)."""

    w: float = 0.0
    m: float = 0.0
    mm: float = 0.0
    t: float = 0.0
    mt: float = 0.0

    def add(self, rows: float, seconds: float, decay: float) -> None:
        self.w, self.m, self.mm = decay * self.w + 1.0, decay * self.m + rows, decay * self.mm + rows * rows
        self.t, self.mt = decay * self.t + seconds, decay * self.mt + rows * seconds


@dataclass
class StepCost:
    prior: float  # b / a before any sample (drafter.ROW_COST)
    decay: float = DECAY
    prior_weight: float = PRIOR_WEIGHT
    regimes: dict[int, _Sums] = field(default_factory=dict)  # requests.bit_length() -> sums
    samples: int = 0  # recorded, all regimes (stats)

    @staticmethod
    def regime(requests: int) -> int:
        return max(1, requests).bit_length()

    def record(self, requests: int, rows: int, seconds: float) -> None:
        """One all-decode step over `requests` requests and `rows` rows (>= requests) cost `seconds`."""
        if requests <= 0 or rows <= 0 or not seconds >= 0:  # NaN too
            return
        s = self.regimes.setdefault(self.regime(requests), _Sums())
        if s.w >= self.prior_weight:
            a, b = self._fit(s)
            pred = a + b * rows
            seconds = min(seconds, CLIP * (pred if pred > 0 else s.t / s.w))
        s.add(float(rows), seconds, self.decay)
        self.samples += 1

    def fit(self, requests: int) -> tuple[float, float]:
        """(a, b) in seconds for the regime of `requests`; (0, 0) before its first sample."""
        s = self.regimes.get(self.regime(requests))
        return self._fit(s) if s is not None and s.w > 0 else (0.0, 0.0)

    def ratio(self, requests: int) -> float:
        """b / a for a step over `requests` requests: the prior until the regime's samples show a slope."""
        s = self.regimes.get(self.regime(requests))
        if s is None or s.w <= 0:
            return self.prior
        a, b = self._fit(s)
        if b <= 0:
            return 0.0 if a > 0 else self.prior
        return MAX_RATIO if a <= b / MAX_RATIO else b / a

    def _fit(self, s: _Sums) -> tuple[float, float]:
        """The line through the regime's weighted mean (M_, t_) whose slope is the data's least-squares slope
        cov / var, pulled toward the prior's slope (b = prior * a through the same mean) by prior_weight
        samples of one row's spread: b = (W cov + k b_prior) / (W var + k). No spread in M: the prior's line."""
        mean_m, mean_t = s.m / s.w, s.t / s.w
        var_w = max(0.0, s.mm - s.m * mean_m)  # W * var(M)
        cov_w = s.mt - s.m * mean_t  # W * cov(M, t)
        b_prior = self.prior * mean_t / (1.0 + self.prior * mean_m)
        b = (cov_w + self.prior_weight * b_prior) / (var_w + self.prior_weight)
        return mean_t - b * mean_m, b

    def to_dict(self) -> dict:
        """Per regime (lowest batch size): the fitted a, b (ms) and the ratio in use (get_stats)."""
        out = {}
        for k in sorted(self.regimes):
            lo = 1 << (k - 1)
            a, b = self.fit(lo)
            out[str(lo)] = {"a_ms": round(a * 1e3, 3), "b_ms": round(b * 1e3, 3), "ratio": round(self.ratio(lo), 4),
                            "weight": round(self.regimes[k].w, 2)}
        return out
