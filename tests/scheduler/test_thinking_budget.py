"""A thinking-token budget: the plan from the prompt (protocol/thinking_budget.py), the scheduler's tracker
(scheduler/thinking_budget.py) state by state, the sampler's override, and whole requests over the FakeRunner
with and without the overlap schedule: the budget's tokens, then the end marker, then greedy decoding again."""

from __future__ import annotations

import pytest
import torch

from fakes import expected_output
from scheduler_utils import assert_whole, make, req

from radixlang_runtime.model.executor.sampler import Sampler
from radixlang_runtime.model.executor.step_io import SampleSpec
from radixlang_runtime.protocol.limits import FieldError, RuntimeLimits
from radixlang_runtime.protocol.sampling_params import SamplingParams
from radixlang_runtime.protocol.thinking_budget import (ThinkingBudget, ThinkingMarkers, plan_budget,
                                                        request_budget)
from radixlang_runtime.scheduler.overlap import OverlapSchedule
from radixlang_runtime.scheduler.thinking_budget import COUNTING, DONE, FORCING, IDLE, BudgetTracker

START, END = (200, 201), (202, 203)  # two-token markers, out of the FakeRunner's vocabulary (fakes.VOCAB)
MARKERS = ThinkingMarkers(START, END, starts_inside=False)


def test_the_plan_reads_the_prompts_last_marker():
    assert plan_budget([1, 2, 3], 4, MARKERS).inside is False
    assert plan_budget([1, 2, 3], 4, ThinkingMarkers(START, END, starts_inside=True)).inside is True
    assert plan_budget([1, *START, 5], 4, MARKERS).inside is True
    assert plan_budget([1, *START, 5, *END, 6], 4, ThinkingMarkers(START, END, True)).inside is False
    assert plan_budget([*START, *END, 7, *START], 4, MARKERS).inside is True
    assert plan_budget([200, 5, 201], 4, MARKERS).inside is False  # the ids apart are not the marker


def test_the_tracker_counts_inside_then_forces_the_end_marker():
    t = BudgetTracker(ThinkingBudget(3, START, END, inside=True))
    out: list[int] = []
    for tok in (5, 6, 7):
        assert t.forced(out) is None and t.state == COUNTING
        out.append(tok)
    assert t.forced(out) == END[0] and t.state == FORCING
    out.append(END[0])
    assert t.forced(out) == END[1]
    out.append(END[1])
    assert t.forced(out) is None and t.state == DONE
    out += [*START, 1, 2, 3, 4]  # a second block is not watched
    assert t.forced(out) is None


def test_idle_until_the_start_marker_and_a_natural_end():
    t = BudgetTracker(ThinkingBudget(2, START, END, inside=False))
    out = [5, START[0]]
    assert t.forced(out) is None and t.state == IDLE
    out.append(START[1])
    assert t.forced(out) is None and t.state == COUNTING and t.count == 0
    out += [8, *END]  # closed by the model within its budget
    assert t.forced(out) is None and t.state == DONE


def test_a_budget_of_zero_closes_at_once_and_a_begun_end_marker_is_finished():
    assert BudgetTracker(ThinkingBudget(0, START, END, inside=True)).forced([]) == END[0]
    t = BudgetTracker(ThinkingBudget(2, START, END, inside=True))
    assert t.forced([5, END[0]]) == END[1]  # the model began the marker as the budget ran out


def test_output_taken_back_is_read_again():
    t = BudgetTracker(ThinkingBudget(2, START, END, inside=True))
    assert t.forced([5, 6]) == END[0]
    assert t.forced([5]) is None and t.count == 1


def test_the_sampler_takes_a_forced_token_greedy_or_not():
    logits = torch.tensor([[0.0, 5.0, 1.0, 2.0]] * 3)
    specs = [SampleSpec(SamplingParams.from_dict({"temperature": 0}), [1], []),
             SampleSpec(SamplingParams.from_dict({"temperature": 0}), [1], [], forced=2),
             SampleSpec(SamplingParams.from_dict({"temperature": 1.0}), [1], [], forced=3)]
    assert Sampler(4, [0], torch.device("cpu"), 0).sample(logits.clone(), specs) == [1, 2, 3]


def limits(**kw) -> RuntimeLimits:
    return RuntimeLimits(4096, 300, 4096, **{"reasoning_parser": "qwen3", "thinking_markers": MARKERS.to_wire(),
                                             **kw})


def test_what_the_intake_refuses_by_name():
    plan = request_budget([1, *START], 5, False, limits())
    assert plan == ThinkingBudget(5, START, END, True)
    cases = [(limits(reasoning_parser="", thinking_markers=()), "without --reasoning-parser"),
             (limits(reasoning_parser="gpt-oss", thinking_markers=()), "gpt-oss has no start / end marker"),
             (limits(speculative=True), "speculative decoding")]
    for lim, why in cases:
        with pytest.raises(FieldError, match=why) as e:
            request_budget([1], 5, False, lim)
        assert e.value.param == "thinking_token_budget"
    with pytest.raises(FieldError, match="cannot be combined with a grammar"):
        request_budget([1], 5, True, limits())
    with pytest.raises(ValueError, match="thinking_token_budget"):
        SamplingParams.from_dict({"thinking_token_budget": -1})


def budget_req(rid: str, n_prompt: int, max_new: int, budget: int):
    r = req(rid, n_prompt, max_new, thinking_token_budget=budget)
    r.input_ids += list(START)  # the prompt opens the block
    r.sampling.thinking = plan_budget(r.input_ids, budget, MARKERS)
    return type(r)(rid=r.rid, input_ids=r.input_ids, sampling=r.sampling)  # the tracker is built with the Req


def expected(r, budget: int, n: int) -> list[int]:
    head = expected_output(r.input_ids, budget) + list(END)
    return head + expected_output(r.input_ids + head, n - len(head))


def run_mix(overlap: bool):
    """Requests with and without a budget together; each output checked against the request alone."""
    sched, _ = make()
    if overlap:
        sched.overlap = OverlapSchedule(sched)
    plain = [req(f"plain{i}", 6 + 3 * i, 12) for i in range(3)]
    budgets = [(budget_req(f"think{b}", 5 + b, 16, b), b) for b in (0, 1, 4, 9)]
    for r in [*plain, *(r for r, _ in budgets)]:
        sched.add_request(r)
    done = {}
    for _ in range(1000):
        if sched.is_idle:
            break
        done.update({r.rid: r.output_ids for r in sched.step() if r.finished})
    assert_whole(sched)
    for r in plain:
        assert done[r.rid] == expected_output(r.input_ids, 12)
    for r, b in budgets:
        assert done[r.rid] == expected(r, b, 16), r.rid
    return sched


def test_requests_with_and_without_a_budget_together():
    run_mix(overlap=False)


def test_the_overlap_schedule_steps_one_by_one_while_a_budget_may_force():
    sched = run_mix(overlap=True)
    assert sched.overlap.sync_steps > 0
    assert sched.overlap.overlapped_steps > 0  # once no budget could force a token
