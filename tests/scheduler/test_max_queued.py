"""--max-queued-requests over the FakeRunner: with the waiting queue full a new request ends at once with a 503
(reported by the next step, holding nothing), under priority scheduling one of higher priority drops the
lowest-ranked waiting request instead; the rest finish with their solo outputs and the allocator is whole."""

from __future__ import annotations

from fakes import expected_output
from scheduler_utils import assert_whole, drain, make, req

from radixlang_runtime.scheduler.preemption import PriorityRule


def with_priority(r, priority: int):
    r.priority = priority
    return r


def run(sched, reqs) -> tuple[list, list]:
    """Add all, then step to the end: (finished with output, refused with an error)."""
    for r in reqs:
        sched.add_request(r)
    done = drain(sched)
    ok = [r for r in done if r.error is None]
    for r in ok:
        assert r.output_ids == expected_output(r.input_ids, r.sampling.max_new_tokens), r.rid
    assert_whole(sched)
    return ok, [r for r in done if r.error is not None]


def test_a_full_queue_refuses_new_requests_with_503():
    sched, _ = make(rows=1)
    sched.cfg.max_queued_requests = 2
    ok, refused = run(sched, [req(f"r{i}", 8, 4) for i in range(5)])
    # r0..r1 queue (the cap counts waiting requests; nothing runs before the first step), r2..r4 are refused
    assert sorted(r.rid for r in ok) == ["r0", "r1"]
    assert sorted(r.rid for r in refused) == ["r2", "r3", "r4"]
    assert all(r.error_status == 503 and "--max-queued-requests 2" in r.error and not r.output_ids for r in refused)


def test_room_again_once_the_queue_drains():
    sched, _ = make(rows=1)
    sched.cfg.max_queued_requests = 1
    sched.add_request(req("a", 8, 4))
    sched.step()  # a runs: the queue is empty again
    ok, refused = run(sched, [req("b", 8, 4), req("c", 8, 4)])
    assert sorted(r.rid for r in ok) == ["a", "b"] and [r.rid for r in refused] == ["c"]


def test_under_priority_scheduling_a_higher_request_drops_the_lowest_waiting_one():
    sched, _ = make(rows=1)
    sched.cfg.priority = PriorityRule(preemption_threshold=100)  # no preemption of the running one here
    sched.cfg.max_queued_requests = 2
    sched.add_request(with_priority(req("run", 8, 6), 0))
    sched.step()
    reqs = [with_priority(req("w1", 8, 4), 1), with_priority(req("w0", 8, 4), 0),  # the queue is full
            with_priority(req("hi", 8, 4), 5),  # drops w0 (lowest), queues
            with_priority(req("lo", 8, 4), 0)]  # ranks no higher than any waiting one: refused
    ok, refused = run(sched, reqs)
    assert sorted(r.rid for r in ok) == ["hi", "run", "w1"]
    assert sorted(r.rid for r in refused) == ["lo", "w0"]
    w0 = next(r for r in refused if r.rid == "w0")
    assert w0.error_status == 503 and "higher priority" in w0.error
