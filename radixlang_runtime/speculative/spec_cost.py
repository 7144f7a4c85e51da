"""StepCost: what a decode step of M rows costs on this machine, measured online (torch-free).

Speculation's keep-or-drop rule (drafter.trim_to_cost) needs c = b / a of a decode step's cost a + b * M
(M rows: the requests' own tokens plus the draft rows, verified as decode rows, executor/verify_step.verify_as_decode).
The ratio is not a machine constant: the step's cost is not linear over 1..64 rows (weights streamed once at
small M, per-row compute at large M), so the slope that matters is the local one around the batch at hand,
and it differs between CPUs, dtypes and thread counts. So the scheduler reports every all-decode step
(Drafts.note_step: its request count, its rows, its cost: the smaller of its wall and process CPU times, as
wall time swells with other processes' load and CPU time with torch threads) and this fits t = a + b * M per
batch size regime (requests 1, 2-3, 4-7, 8-15, ...: the steps one regime sees span M = B .. B + its draft
rows, and batch sizes drifting as requests finish), by exponentially decayed least squares (DECAY per sample:
the machine's load and the context length drift) whose slope is pulled toward the prior's (b = prior * a) by
PRIOR_WEIGHT samples of one row's spread: with no samples, or samples all at one M (no slope to see), the
ratio is the prior (drafter.ROW_COST); with samples spread over M the measured slope wins. Behind the line, a
realized check (drafts_pay): the regime's tokens per second in steps with draft rows against steps without.

Pinned mode (adaptive=False; RADIXLANG_SPEC_STEP_COST=fixed, which the test suite sets so that which drafts a
loaded CI machine keeps never depends on its timing): samples are still recorded and shown, but ratio() is the
prior and drafts_pay() is True.

Invariants: ratio() is in [0, MAX_RATIO] and equals the prior for a regime with no samples; record() is O(1)
and never raises on odd input (a negative or NaN time, a non-positive row count: ignored); no clock read here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

DECAY = 0.97  # weight of the past per sample in a regime (~33 samples' memory)
PRIOR_WEIGHT = 4.0  # the prior slope's pull, in samples one row off the mean
MAX_RATIO = 1000.0  # b / a when the fit's intercept is ~0 or below (rows cost everything: drafts only if sure)
EXPLORE = 8  # while drafts_pay is False, one gated step in EXPLORE keeps its drafts (the drafted rate stays measured)
GUARD_MIN = 8.0  # samples (decayed weight) of each kind before drafts_pay compares realized rates
CLIP = 4.0  # a sample above CLIP x the prediction counts as CLIP x it (a descheduled thread, a GC pause)


@dataclass
class _Sums:
    """Decayed sums of one regime's samples (w: weights, m: rows, t: seconds); and per kind of step (plain:
    no draft rows; drafted: some) its weight, tokens produced and seconds, for the realized rates."""

    w: float = 0.0
    m: float = 0.0
    mm: float = 0.0
    t: float = 0.0
    mt: float = 0.0
    rates: dict[bool, list[float]] = field(default_factory=lambda: {False: [0.0, 0.0, 0.0], True: [0.0, 0.0, 0.0]})

    def add(self, rows: float, seconds: float, decay: float) -> None:
        self.w, self.m, self.mm = decay * self.w + 1.0, decay * self.m + rows, decay * self.mm + rows * rows
        self.t, self.mt = decay * self.t + seconds, decay * self.mt + rows * seconds

    def add_rate(self, drafted: bool, tokens: float, seconds: float, decay: float) -> None:
        r = self.rates[drafted]
        r[0], r[1], r[2] = decay * r[0] + 1.0, decay * r[1] + tokens, decay * r[2] + seconds


STEP_COST_ENV = "RADIXLANG_SPEC_STEP_COST"  # "measured" (default) or "fixed" (the prior only)


def adaptive_from_env() -> bool:
    mode = os.environ.get(STEP_COST_ENV, "measured")
    if mode not in ("measured", "fixed"):
        raise ValueError(f"{STEP_COST_ENV}={mode!r}: expected 'measured' or 'fixed'")
    return mode == "measured"


@dataclass
class StepCost:
    prior: float  # b / a before any sample (drafter.ROW_COST)
    decay: float = DECAY
    prior_weight: float = PRIOR_WEIGHT
    regimes: dict[int, _Sums] = field(default_factory=dict)  # requests.bit_length() -> sums
    samples: int = 0  # recorded, all regimes (stats)
    adaptive: bool = True  # False: decisions use the prior only (samples still recorded)

    @staticmethod
    def regime(requests: int) -> int:
        return max(1, requests).bit_length()

    def record(self, requests: int, rows: int, seconds: float, tokens: int = 0, extra: float = 0.0) -> None:
        """One all-decode step over `requests` requests and `rows` rows (>= requests) cost `seconds` and produced
        `tokens` (requests + accepted draft tokens; 0: not known, no realized-rate sample). `extra`: seconds spent
        outside the step for its drafts (a draft model's proposal): in the realized rate, not in the line."""
        if requests <= 0 or rows <= 0 or not seconds >= 0 or not extra >= 0:  # NaN too
            return
        s = self.regimes.setdefault(self.regime(requests), _Sums())
        if s.w >= self.prior_weight:
            a, b = self._fit(s)
            pred = a + b * rows
            seconds = min(seconds, CLIP * (pred if pred > 0 else s.t / s.w))
        s.add(float(rows), seconds, self.decay)
        if tokens > 0:
            s.add_rate(rows > requests, float(tokens), seconds + extra, self.decay)
        self.samples += 1

    def drafts_pay(self, requests: int) -> bool:
        """The realized check behind the model: False once this regime's drafted steps (GUARD_MIN samples at least)
        produced fewer tokens per second than its plain ones (as many): whatever the line missed (a verifying
        step's fixed extra cost, a wrong acceptance estimate), drafting then costs throughput."""
        s = self.regimes.get(self.regime(requests))
        if s is None or not self.adaptive:
            return True
        (pw, ptok, pt), (dw, dtok, dt) = s.rates[False], s.rates[True]
        if pw < GUARD_MIN or dw < GUARD_MIN or pt <= 0 or dt <= 0:
            return True
        return dtok / dt >= ptok / pt

    def wants_plain(self, requests: int) -> bool:
        """For a drafter that drafts on every step it may (a draft model), which therefore sees no plain step by
        itself: True while this regime has fewer than GUARD_MIN plain samples and more drafted ones,
        so the first steps of a regime alternate drafted and plain until drafts_pay can compare them."""
        s = self.regimes.get(self.regime(requests))
        if s is None or not self.adaptive:
            return False
        pw, dw = s.rates[False][0], s.rates[True][0]
        return pw < GUARD_MIN and dw > pw

    def fit(self, requests: int) -> tuple[float, float]:
        """(a, b) in seconds for the regime of `requests`; (0, 0) before its first sample."""
        s = self.regimes.get(self.regime(requests))
        return self._fit(s) if s is not None and s.w > 0 else (0.0, 0.0)

    def ratio(self, requests: int) -> float:
        """b / a for a step over `requests` requests: the prior until the regime's samples show a slope."""
        s = self.regimes.get(self.regime(requests))
        if s is None or s.w <= 0 or not self.adaptive:
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
            rates = {kind: round(r[1] / r[2], 1) if r[2] > 0 else None
                     for kind, r in (("plain", self.regimes[k].rates[False]), ("drafted", self.regimes[k].rates[True]))}
            out[str(lo)] = {"a_ms": round(a * 1e3, 3), "b_ms": round(b * 1e3, 3), "ratio": round(self.ratio(lo), 4),
                            "weight": round(self.regimes[k].w, 2), "tok_s": rates, "drafts_pay": self.drafts_pay(lo)}
        return out
