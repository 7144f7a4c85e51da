"""Weight updates on the scheduler's side (scheduler/weight_sync.py) over the FakeRunner: refused while a request
is in, a loader's failure of any type answered (the cache kept), a success flushes the prefix cache and pins."""

from __future__ import annotations

from scheduler_utils import assert_whole, drain, make, req

from radixlang_runtime.scheduler.weight_sync import BUSY, apply_weight_update


def test_an_update_waits_for_idle_answers_any_failure_and_flushes_on_success():
    sched, _ = make()
    r = req("a", 12, 4)
    sched.add_request(r)
    assert apply_weight_update(sched, lambda runner: 1, "x") == (False, BUSY)
    drain(sched)
    cached = sched.kv.cached_size()
    assert cached > 0

    def broken(runner):
        raise RuntimeError("a tensor the loader choked on")

    ok, message = apply_weight_update(sched, broken, "x")
    assert not ok and "RuntimeError: a tensor the loader choked on" in message
    assert sched.kv.cached_size() == cached  # a failed update keeps the cache
    assert apply_weight_update(sched, lambda runner: 3, "x") == (True, "Succeeded to update model weights.")
    assert sched.kv.cached_size() == 0
    assert_whole(sched)
