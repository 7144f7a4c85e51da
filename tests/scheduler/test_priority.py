"""Priority scheduling (--enable-priority-scheduling: preemption.PriorityRule and preempt_for_head) over the
FakeRunner: the waiting queue runs by priority (higher first, or lower with low_values_first; the policy's order
among equals), a waiting request retracts the running ones it outranks by more than the threshold (when a budget
they hold refused it: running slots or KV), never others; every request's output is what it would be alone
(fakes.expected_output) and the allocator is whole after each scenario, with and without the overlap schedule."""

from __future__ import annotations

import pytest

from fakes import expected_output
from scheduler_utils import assert_whole, drain, make, req

from radixlang_runtime.scheduler.overlap import OverlapSchedule
from radixlang_runtime.scheduler.preemption import PriorityRule


def scheduler(rule: PriorityRule, overlap: bool = False, **make_kw):
    sched, runner = make(**make_kw)
    sched.cfg.priority = rule
    if overlap:
        sched.overlap = OverlapSchedule(sched)
    return sched, runner


def with_priority(r, priority: int):
    r.priority = priority
    return r


def finish_order(sched) -> list[str]:
    done = drain(sched)
    for r in done:
        assert r.output_ids == expected_output(r.input_ids, r.sampling.max_new_tokens), r.rid
    assert_whole(sched)
    return [r.rid for r in done]


@pytest.mark.parametrize("low_first", [False, True])
def test_the_queue_runs_by_priority_then_arrival(low_first):
    sched, _ = scheduler(PriorityRule(low_values_first=low_first), rows=1)
    for rid, p in (("a", 1), ("b", 5), ("c", 1), ("d", 3), ("e", 5)):
        sched.add_request(with_priority(req(rid, 8, 4), p))
    want = ["a", "c", "d", "b", "e"] if low_first else ["b", "e", "d", "a", "c"]
    assert finish_order(sched) == want
    assert sched.num_preempted_total == 0  # a waiting request never retracts the one already running


@pytest.mark.parametrize("overlap", [False, True])
def test_a_request_that_outranks_by_more_than_the_threshold_retracts_a_running_one(overlap):
    sched, _ = scheduler(PriorityRule(preemption_threshold=10), overlap=overlap, rows=1)
    low = with_priority(req("low", 10, 60), 0)
    sched.add_request(low)
    for _ in range(5):
        sched.step()
    assert sched.running == [low] and len(low.output_ids) >= 3
    sched.add_request(with_priority(req("near", 6, 4), 10))  # 10 above: not more than the threshold
    sched.step()
    assert sched.running == [low] and sched.num_preempted_total == 0
    sched.add_request(with_priority(req("high", 6, 4), 11))
    for _ in range(3):
        sched.step()
    assert low.num_retractions == 1 and sched.num_preempted_total == 1
    assert low not in sched.running
    assert finish_order(sched) == ["high", "near", "low"]  # the retracted one queues by its own priority


def test_kv_held_by_lower_priority_requests_is_given_up():
    """A pool that two running requests fill: a higher-priority arrival retracts the lowest-ranked of them (then
    the one with more to decode), and only as many as it needs."""
    sched, _ = scheduler(PriorityRule(preemption_threshold=0), num_slots=160, rows=8, ratio=1.0)
    first = [with_priority(req("p1", 20, 50), 1), with_priority(req("p0", 20, 50), 0)]
    for r in first:
        sched.add_request(r)
    for _ in range(4):
        sched.step()
    assert sorted(r.rid for r in sched.running) == ["p0", "p1"]
    sched.add_request(with_priority(req("top", 20, 30), 2))
    for _ in range(3):
        sched.step()
    assert [r.num_retractions for r in first] == [0, 1]  # p0 ranks lowest
    assert sched.num_preempted_total == 1
    order = finish_order(sched)
    assert set(order) == {"p1", "p0", "top"} and order.index("top") < order.index("p0")


def test_without_a_rule_priority_changes_nothing():
    sched, _ = make(rows=1)
    for rid, p in (("a", 0), ("b", 100)):
        sched.add_request(with_priority(req(rid, 8, 4), p))
    assert finish_order(sched) == ["a", "b"]
    assert sched.num_preempted_total == 0
