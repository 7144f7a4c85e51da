"""The overlap schedule (scheduler/overlap.py) over the FakeRunner: the same outputs as the plain schedule for a
mix of requests (lengths, stop ids, stop strings, max_new_tokens, radix hits, aborts, retraction on a tight pool),
the KV allocator whole after each scenario (check_integrity after every step too), and steps really overlapped."""

from __future__ import annotations

import pytest

from fakes import expected_output
from scheduler_utils import assert_whole, drain, make, req

from radixlang_runtime.scheduler.overlap import OverlapSchedule, overlap_off_reason
from radixlang_runtime.server_args import ServerArgs


def text(ids: list[int]) -> str:
    return "".join(chr(65 + t % 26) for t in ids)


def mixed_requests(tag: str) -> list:
    """Different lengths, a stop id, a stop string, a shared prefix (a radix hit), max_new_tokens 1."""
    reqs = [req(f"{tag}len{i}", 5 + 7 * i, 3 + 5 * i) for i in range(6)]
    base = req("stop", 12, 40)
    stop_at = expected_output(base.input_ids, 40)[6]
    reqs.append(req("stop", 12, 40, stop_token_ids=[stop_at]))
    first = expected_output(base.input_ids, 40)
    reqs.append(req("stop", 12, 40, stop=[text(first[8:10])]))
    reqs[-1].rid = "stopstr"
    shared = req("shared0", 30, 10)
    twin = req("shared1", 30, 12)
    twin.input_ids = shared.input_ids[:24] + twin.input_ids[24:]
    reqs += [shared, req("one", 9, 1)]
    return reqs, twin  # the twin arrives later: it matches its prefix in the cache


def run(overlap: bool, reqs: list, abort_after: dict[int, str] = (), late: tuple = (), **make_kw):
    """late: (step, request) pairs, added after that many steps."""
    sched, _ = make(**make_kw)
    sched.detokenize = text
    if overlap:
        sched.overlap = OverlapSchedule(sched)
    for r in reqs:
        sched.add_request(r)
    finished, steps = [], 0
    abort_after = dict(abort_after)
    while not sched.is_idle:
        finished += [r for r in sched.step() if r.finished]
        steps += 1
        if steps in abort_after:
            sched.abort(abort_after[steps])
        for at, r in late:
            if at == steps:
                sched.add_request(r)
        assert steps < 5000, "scheduler did not drain"
    assert_whole(sched)
    return sched, {r.rid: (r.output_ids, r.finished_reason) for r in finished}


def cached_tokens(sched) -> int:
    return sched.kv.cached_size()


def test_overlap_gives_the_plain_schedules_outputs_and_cache():
    reqs, twin = mixed_requests("a")
    plain, want = run(False, reqs, late=[(12, twin)])
    reqs, twin = mixed_requests("a")
    over, got = run(True, reqs, late=[(12, twin)])
    assert got == want
    assert want["stop"][1]["type"] == "stop" and len(want["stop"][0]) == 7
    assert want["stopstr"][1]["type"] == "stop" and len(want["stopstr"][0]) == 10
    assert want["one"][0] and len(want["one"][0]) == 1
    assert over.overlap.overlapped_steps > 0
    assert over.admission.prefill_tokens_cached == plain.admission.prefill_tokens_cached > 0  # the radix hit
    # the same cache afterwards: what the finished requests computed, nothing past a finish
    assert over.allocator.available_size() == plain.allocator.available_size()
    assert cached_tokens(over) == cached_tokens(plain)


def test_overlap_outputs_match_each_request_alone():
    reqs, twin = mixed_requests("b")
    _, got = run(True, reqs, late=[(3, twin)], page_size=4)
    for r in mixed_requests("b")[0]:
        if r.rid.startswith("b"):
            assert got[r.rid][0] == expected_output(r.input_ids, r.sampling.max_new_tokens)


def test_abort_mid_flight_frees_everything():
    reqs = [req(f"ab{i}", 10 + i, 30) for i in range(4)]
    _, got = run(True, reqs, abort_after={4: "ab1", 6: "ab3"})
    _, want = run(False, [req(f"ab{i}", 10 + i, 30) for i in range(4)], abort_after={4: "ab1", 6: "ab3"})
    for rid in ("ab0", "ab2"):
        assert got[rid] == want[rid]
    for rid in ("ab1", "ab3"):
        assert got[rid][1]["type"] == "abort"
        full = expected_output(next(r for r in reqs if r.rid == rid).input_ids, 30)
        assert got[rid][0] == full[: len(got[rid][0])] and len(got[rid][0]) < 30


def test_retraction_on_a_tight_pool():
    def reqs():
        return [req(f"rt{i}", 20, 60) for i in range(6)]

    plain, want = run(False, reqs(), num_slots=220, ratio=0.05)
    over, got = run(True, reqs(), num_slots=220, ratio=0.05)
    assert plain.num_retracted_total > 0 and over.num_retracted_total > 0
    assert got == want
    for r in reqs():
        assert got[r.rid][0] == expected_output(r.input_ids, 60)
    assert over.overlap.overlapped_steps > 0


def test_chunked_prefill_and_mixed_chunk():
    def reqs():
        return [req("long", 300, 8), *[req(f"ch{i}", 8, 20) for i in range(3)]]

    _, want = run(False, reqs(), chunk=64, max_prefill=64)
    over, got = run(True, reqs(), chunk=64, max_prefill=64)
    assert got == want
    over.cfg.enable_mixed_chunk = True
    _, mixed = run(True, reqs(), chunk=64, max_prefill=64)
    assert mixed == want


def test_drain_waits_for_the_step_in_flight():
    sched, _ = make()
    sched.overlap = OverlapSchedule(sched)
    r = req("solo", 6, 5)
    sched.add_request(r)
    drain(sched)
    assert r.output_ids == expected_output(r.input_ids, 5) and r.future is None
    assert_whole(sched)


def test_a_forward_fault_ends_its_requests_and_frees_everything():
    """The fault of a step in flight ends its batch (and the step behind it that reads its tokens); the others
    finish with their own outputs; nothing leaks."""
    sched, runner = make()
    calls = {"n": 0}
    forward = runner.forward

    def faulty(batch):
        if "bad" in batch.rids:
            calls["n"] += 1
            if calls["n"] == 4:
                raise RuntimeError("injected")
        return forward(batch)

    runner.forward = faulty
    sched.overlap = OverlapSchedule(sched)
    reqs = [req("bad", 8, 20), *[req(f"ok{i}", 6 + i, 12) for i in range(3)]]
    for r in reqs:
        sched.add_request(r)
    late = req("late", 7, 10)
    steps = 0
    while not sched.is_idle or late.admitted_at is None:
        sched.step()
        steps += 1
        if reqs[0].finished and late.admitted_at is None and late not in sched.waiting:
            sched.add_request(late)
        assert steps < 1000
    assert reqs[0].error is not None and "injected" in reqs[0].error
    for r in [*reqs[1:], late]:
        assert r.finished
        if r.error is None:
            assert r.output_ids == expected_output(r.input_ids, r.sampling.max_new_tokens)
    assert late.error is None  # it arrived after the fault
    assert_whole(sched)


def test_which_configurations_overlap():
    plain = ServerArgs(model_path="m")
    assert overlap_off_reason(plain, "cuda", False) is None
    assert "cpu default" in overlap_off_reason(plain, "cpu", False)
    assert overlap_off_reason(ServerArgs(model_path="m", enable_overlap_schedule=True), "cpu", False) is None
    assert overlap_off_reason(plain, "cuda", True) == "hybrid state snapshots"
    assert overlap_off_reason(ServerArgs(model_path="m", disable_overlap_schedule=True), "cuda", False) \
        == "--disable-overlap-schedule"
    forced = ServerArgs(model_path="m", enable_overlap_schedule=True, speculative_algorithm="NGRAM")
    with pytest.raises(ValueError, match="speculative decoding"):
        overlap_off_reason(forced, "cpu", False)
    with pytest.raises(ValueError, match="contradict"):
        ServerArgs(model_path="m", enable_overlap_schedule=True, disable_overlap_schedule=True)


def test_idle_in_the_step_the_last_request_finishes():
    """The step in flight behind the last finish holds nothing to keep: the scheduler is idle (flush_cache
    works) as soon as the step that finished the last request returns."""
    sched, _ = make()
    sched.overlap = OverlapSchedule(sched)
    r = req("last", 6, 4)
    sched.add_request(r)
    while not r.finished:
        sched.step()
    assert sched.is_idle and sched.flush_cache()
    assert_whole(sched)
