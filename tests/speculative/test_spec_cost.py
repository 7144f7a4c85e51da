"""The step cost model of speculation's keep-or-drop rule (scheduler/spec_cost.StepCost, Drafts.gate): synthetic
step timings in, the fitted cost and the rows trim_to_cost keeps out. Deterministic: no clock is read."""

from __future__ import annotations

import math
import random

import pytest

from radixlang_runtime.protocol.sampling_params import SamplingParams
from radixlang_runtime.speculative.drafter import ROW_COST, NgramConfig, NgramDrafter
from radixlang_runtime.speculative.drafts import Drafts
from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.speculative.spec_cost import DECAY, EXPLORE, GUARD_MIN, STEP_COST_ENV, StepCost


@pytest.fixture(autouse=True)
def measured_mode(monkeypatch):
    """The suite pins the rule to its prior (conftest); these tests check the measured mode it pins."""
    monkeypatch.setenv(STEP_COST_ENV, "measured")


def feed(cost: StepCost, requests: int, a: float, b: float, rows: list[int], n: int = 200, seed: int = 0):
    """n steps over `requests` requests, rows drawn from `rows`, each taking exactly a + b * rows seconds."""
    rng = random.Random(seed)
    for _ in range(n):
        m = rng.choice(rows)
        cost.record(requests, m, a + b * m)


def test_the_prior_until_samples_show_a_slope():
    cost = StepCost(ROW_COST)
    assert cost.ratio(1) == cost.ratio(64) == ROW_COST and cost.fit(4) == (0.0, 0.0)
    feed(cost, 4, 0.010, 0.002, [4])  # every step at M = 4: only the level is known, the slope stays the prior's
    a, b = cost.fit(4)
    assert b / a == pytest.approx(ROW_COST) and a + 4 * b == pytest.approx(0.018)
    assert cost.ratio(64) == ROW_COST  # another regime: no samples


@pytest.mark.parametrize("a,b,rows", [(0.008, 0.002, [4, 8, 12, 16, 20]), (0.013, 0.0002, [1, 2, 3, 4, 5]),
                                      (0.002, 0.0019, list(range(64, 128, 8)))])
def test_recovers_the_line_from_spread_samples(a, b, rows):
    cost = StepCost(ROW_COST)
    feed(cost, rows[0], a, b, rows)
    fa, fb = cost.fit(rows[0])
    assert fa == pytest.approx(a, rel=0.02)
    # the slope: the data's, pulled a little toward the prior's (PRIOR_WEIGHT samples one row off the mean)
    assert abs(cost.ratio(rows[0]) - b / a) < 0.1 * abs(ROW_COST - b / a)


def test_regimes_are_separate_and_follow_drift():
    cost = StepCost(ROW_COST)
    feed(cost, 1, 0.013, 0.0002, [1, 2, 3, 4, 5])
    feed(cost, 5, 0.008, 0.002, [4, 8, 12, 16])  # batch 4-7: its own regime
    assert abs(cost.ratio(1) - 0.0002 / 0.013) < 0.1 * (ROW_COST - 0.0002 / 0.013)
    assert cost.ratio(7) == pytest.approx(0.25, rel=0.05) and cost.ratio(8) == ROW_COST
    feed(cost, 4, 0.008, 0.008, [4, 8, 12, 16], n=150, seed=1)  # rows got 4x dearer: the decayed fit follows
    assert cost.ratio(4) == pytest.approx(1.0, rel=0.1)
    assert set(cost.to_dict()) == {"1", "4"} and cost.to_dict()["4"]["ratio"] == pytest.approx(1.0, rel=0.1)


def test_outliers_are_clipped_and_bad_samples_ignored():
    cost = StepCost(ROW_COST)
    feed(cost, 4, 0.008, 0.002, [4, 8, 12, 16, 20])
    before = cost.fit(4)
    cost.record(4, 4, 5.0)  # a descheduled thread: counts as at most 4x the prediction
    a, b = cost.fit(4)
    assert a + 4 * b < 1.5 * (before[0] + 4 * before[1])
    n = cost.samples
    for args in ((0, 4, 0.01), (4, 0, 0.01), (4, 4, -1.0), (4, 4, float("nan"))):
        cost.record(*args)
    assert cost.samples == n


# ---------------------------------------------------------------------------------------------- the rule
def batch(n: int, hits: float, misses: float) -> list[Req]:
    reqs = []
    for i in range(n):
        r = Req(rid=f"r{i}", input_ids=[1, 2, 3],
                sampling=SamplingParams.from_dict({"max_new_tokens": 32, "temperature": 0}))
        r.draft = [5, 6, 7, 8]
        a = (hits + 1) / (hits + misses + 2)  # each row taken with probability a (Beta(1, 1) over the counts)
        r.spec_values = [a ** (j + 1) for j in range(4)]
        reqs.append(r)
    return reqs


def step(d: Drafts, requests: int, rows: int, wall: float, cpu: float) -> None:
    """A step as the scheduler reports it, every draft row accepted."""
    d._step_accepted = rows - requests
    d.note_step(requests, rows, True, wall, cpu)


def drafts_with(cost_fn) -> Drafts:
    d = Drafts(NgramDrafter(NgramConfig(4, 2, 4, 0, ROW_COST), (96,), 4096), None, lambda r: None)
    cost_fn(d)
    return d


def test_gate_uses_the_measured_ratio():
    """Batch 4 drafts with acceptance 0.6: kept under the prior (break-even ~0.34), cut when this machine's steps
    show rows cost 0.5 of the fixed part (break-even ~0.67); a lone request keeps every row when rows are ~free.
    A step's cost is the smaller of its wall and CPU times (the first fit from wall times, the second from CPU)."""
    prior = drafts_with(lambda d: None)
    reqs = batch(4, 2.0, 1.0)  # acceptance (2 + 1) / (3 + 2) = 0.6
    prior.gate(reqs)
    assert all(len(r.draft) >= 1 for r in reqs)
    dear = drafts_with(lambda d: [step(d, 4, m, 0.004 + 0.002 * m, 1.0) for m in (4, 8, 12, 16, 20) * 20])
    reqs = batch(4, 2.0, 1.0)
    dear.gate(reqs)
    assert all(r.draft == [] for r in reqs)
    cheap = drafts_with(lambda d: [step(d, 1, m, 9.0, 0.013 + 0.0001 * m) for m in (1, 2, 3, 4, 5) * 20])
    reqs = batch(1, 0.0, 0.0)  # acceptance 0.5: the 4th row is worth 0.06 tokens, nearly free rows still pay
    cheap.gate(reqs)
    assert len(reqs[0].draft) == 4


def test_large_batches_step_aside_when_rows_are_not_free():
    """Compute-bound batch 64 (a step costs ~ its rows): even 90%-sure drafts are dropped; steps that mix in a
    prefill are not samples."""
    def compute_bound(d):
        for m in (64, 80, 96, 112, 128) * 20:
            step(d, 64, m, 0.001 + 0.0019 * m, 0.001 + 0.0019 * m)
        d.note_step(64, 64, False, 100.0, 100.0)  # a mixed prefill + decode step: ignored
    d = drafts_with(compute_bound)
    assert d.cost.samples == 100 and d.cost.ratio(64) > 1.0
    reqs = batch(64, 17.0, 1.0)  # acceptance 0.9
    d.gate(reqs)
    assert all(r.draft == [] for r in reqs)


def test_fixed_mode_records_but_decides_by_the_prior(monkeypatch):
    """RADIXLANG_SPEC_STEP_COST=fixed: the same dear steps as above are recorded, yet the prior keeps the drafts
    and the realized check never vetoes; an unknown value is refused by name."""
    monkeypatch.setenv(STEP_COST_ENV, "fixed")
    d = drafts_with(lambda d: [step(d, 4, m, 0.004 + 0.002 * m, 1.0) for m in (4, 8, 12, 16, 20) * 20])
    assert d.cost.samples == 100 and d.cost.ratio(4) == ROW_COST and d.cost.drafts_pay(4)
    reqs = batch(4, 2.0, 1.0)
    d.gate(reqs)
    assert all(len(r.draft) >= 1 for r in reqs)
    monkeypatch.setenv(STEP_COST_ENV, "sometimes")
    with pytest.raises(ValueError, match=STEP_COST_ENV):
        drafts_with(lambda d: None)


def test_no_cost_model_without_the_rule():
    """row_cost 0 (the fakes' default, STANDALONE): no rule, nothing recorded."""
    d = Drafts(NgramDrafter(NgramConfig(4, 2, 4), (96,), 4096), None, lambda r: None)
    assert d.cost is None
    d.note_step(4, 8, True, 0.01, 0.01)
    reqs = batch(64, 0.0, 5.0)
    d.gate(reqs)
    assert all(len(r.draft) == 4 for r in reqs)


def test_no_lookup_where_no_row_could_pay():
    """Prior ratio at batch 64: a first row needs P(taken) > 0.89. A request is looked up once; after a two-token
    match (P 3/4) it is not looked up again at batch 64 but one step in EXPLORE, while alone it drafts every step;
    a long match (P > 0.89) keeps it looked up at batch 64."""
    d = drafts_with(lambda d: None)
    r = Req(rid="x", input_ids=[7, 1, 2, 3, 4, 5, 6, 8, 1, 2],
            sampling=SamplingParams.from_dict({"max_new_tokens": 32}))
    d.propose(r, 64)
    assert r.spec_index is not None and r.spec_match == 2 and r.draft == [3, 4, 5, 6]
    looked = []
    for _ in range(EXPLORE):
        d.propose(r, 64)
        looked.append(r.draft != [])
    assert looked == [False] * (EXPLORE - 1) + [True]
    d.propose(r, 1)
    assert r.draft == [3, 4, 5, 6]
    long = Req(rid="y", input_ids=[1, 2, 3] * 10, sampling=SamplingParams.from_dict({"max_new_tokens": 32}))
    d.propose(long, 64)
    for _ in range(3):
        d.propose(long, 64)
        assert len(long.draft) == 4 and long.spec_match == 27


def test_realized_rates_veto_drafts_that_do_not_pay():
    """Whatever the line says, a batch size whose drafted steps produced fewer tokens per second than its plain
    ones drafts only one gated step in EXPLORE; when drafted steps are faster, drafts stay."""
    slow = StepCost(ROW_COST)
    for _ in range(10):
        slow.record(4, 4, 0.016, tokens=4)  # 250 tok/s
        slow.record(4, 12, 0.040, tokens=6)  # 150 tok/s: the rows cost more than the tokens they bring
    assert slow.drafts_pay(4) is False and slow.drafts_pay(1) is True  # batch 1 has no samples
    assert slow.to_dict()["4"]["tok_s"] == {"plain": 250.0, "drafted": 150.0}
    d = drafts_with(lambda d: None)
    d.cost = slow
    kept = []
    for _ in range(2 * EXPLORE):
        reqs = batch(4, 20.0, 0.0)  # sure drafts: the line alone would keep them
        d.gate(reqs)
        kept.append(sum(len(r.draft) for r in reqs))
    assert sum(1 for k in kept if k) == 2 and all(k == 0 for k in kept[:EXPLORE - 1])
    fast = StepCost(ROW_COST)
    for _ in range(10):
        fast.record(4, 4, 0.016, tokens=4)
        fast.record(4, 12, 0.030, tokens=9)  # 300 tok/s
    assert fast.drafts_pay(4) is True


def test_note_step_counts_the_tokens_a_step_produced():
    """note_step's token count: requests + n-gram tokens accepted in that step; a step with an accepted jump-forward
    draft is no realized-rate sample (its forced tokens are not counted here)."""
    d = drafts_with(lambda d: None)
    d._step_accepted = 3
    d.note_step(4, 12, True, 0.03, 0.03)
    assert d.cost.regimes[3].rates[True][1] == 7.0 and d._step_accepted == 0
    d._step_forced = True
    d.note_step(4, 4, True, 0.02, 0.02)
    assert d.cost.regimes[3].rates[False][0] == 0.0 and d.cost.samples == 2


def test_a_draft_model_samples_plain_steps_then_steps_aside_for_good_at_a_large_batch():
    """A draft model drafts on every step it may, so its first steps in a regime alternate drafted and plain
    (wants_plain) until each kind has GUARD_MIN samples; its drafted rate includes the proposal's seconds
    (`extra`, not in the cost line). Vetoed at a large batch it steps aside on every gated step (pause: no
    proposal, no mirror) - no exploration, which would first catch up every step it skipped for every request;
    at a small batch it explores, backing off (the EXPLORE-th, 2 EXPLORE-th, ... vetoed step)."""

    class FakeModelDrafter:  # the ModelDrafter surface Drafts.gate uses
        cfg = type("Cfg", (), {"row_cost": ROW_COST, "disable_batch_size": 0})()

        def __init__(self):
            self.fills = self.pauses = 0

        def fill(self, running):
            self.fills += 1
            return 0.0

        def pause(self):
            self.pauses += 1

    d = Drafts(FakeModelDrafter(), None, lambda r: None)
    d.cost = StepCost(ROW_COST)
    kinds = []
    n = 1 + int(math.log(1 - GUARD_MIN * (1 - DECAY)) / math.log(DECAY))  # samples of a kind to reach GUARD_MIN
    for _ in range(2 * n + 8):  # batch 32: drafted steps 0.2 s + 0.2 s proposing, plain ones 0.05 s
        fills = d.drafter.fills
        d.gate(batch(32, 0.0, 0.0))
        drafted = d.drafter.fills > fills
        kinds.append(drafted)
        if drafted:
            d.cost.record(32, 128, 0.2, tokens=120, extra=0.2)
        else:
            d.cost.record(32, 32, 0.05, tokens=32)
    assert kinds[:2 * n] == [True, False] * n  # a new regime: drafted first, then alternating
    assert not any(kinds[2 * n:])  # 300 tok/s drafted against 640 plain: stepped aside, not explored
    assert d.cost.to_dict()["32"]["tok_s"] == {"plain": 640.0, "drafted": 300.0}  # extra seconds in the rate...
    a, b = d.cost.fit(32)
    assert a + b * 128 == pytest.approx(0.2, rel=0.05)  # ...not in the line
    d.cost = StepCost(ROW_COST)  # batch 2, vetoed: explored, backing off (catching up is small there)
    for _ in range(n):
        d.cost.record(2, 8, 0.05, tokens=3)
        d.cost.record(2, 2, 0.01, tokens=2)
    assert not d.cost.wants_plain(2) and d.cost.drafts_pay(2) is False
    d.drafter.fills = d.drafter.pauses = 0
    explored = []
    for i in range(8 * EXPLORE):
        fills = d.drafter.fills
        d.gate(batch(2, 0.0, 0.0))
        if d.drafter.fills > fills:
            explored.append(i + 1)
    assert explored == [EXPLORE, 2 * EXPLORE, 4 * EXPLORE, 8 * EXPLORE]  # exploring fades (backs off)
    fast = StepCost(ROW_COST)  # batch 1 where drafts pay: drafted on every step once sampled
    for _ in range(n):
        fast.record(1, 5, 0.016, tokens=4, extra=0.008)  # ~167 tok/s against 100
        fast.record(1, 1, 0.010, tokens=1)
    d.cost, d.drafter.fills = fast, 0
    for _ in range(EXPLORE):
        d.gate(batch(1, 0.0, 0.0))
    assert d.drafter.fills == EXPLORE
