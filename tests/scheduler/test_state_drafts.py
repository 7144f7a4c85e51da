"""Drafts on a hybrid model, the scheduler's side (torch-free): n-gram drafts verified by a fake runner with a
recurrent state (tests/fakes.FakeStateRunner keeps in a request's slot only its token and the draft tokens the
model accepted, as the real runner's rollback does, and fails a snapshot asked for inside a draft). Outputs
equal decoding alone; drafts were accepted and rejected; snapshots are taken only where a step's own token ends
on a page boundary (scheduler/state_cache.py), so an extension continuing from a finished request's snapshot,
and a retracted request's re-prefill, continue from states without a rejected token; pools whole after."""

from __future__ import annotations

import random

import pytest

from fakes import FakeStateRunner, copy_token, expected_output
from radixlang_runtime.mem.allocator import PageAllocator
from radixlang_runtime.mem.radix_cache import RadixCache
from radixlang_runtime.mem.state_slots import StateSlots
from radixlang_runtime.mem.table import TableManager
from radixlang_runtime.protocol.sampling_params import SamplingParams
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.scheduler.scheduler import Scheduler, SchedulerConfig
from radixlang_runtime.scheduler.state_cache import StateCache
from radixlang_runtime.speculative.drafter import NgramConfig, NgramDrafter

EOS = 96
ROWS = 8


def make(page_size: int, mixed: bool = False, num_slots: int = 4096, ratio: float = 0.7):
    cfg = SchedulerConfig(page_size=page_size, context_len=4096, max_running_requests=ROWS, max_prefill_tokens=256,
                          chunked_prefill_size=32, eos_token_ids=(EOS,), new_token_ratio_init=ratio,
                          new_token_ratio_min=0.05, new_token_ratio_decay=0.01, enable_mixed_chunk=mixed,
                          debug_check_integrity=True)
    radix = RadixCache(page_size)
    kv = KVManager(PageAllocator(num_slots, page_size), TableManager(ROWS), radix,
                   states=StateCache(radix, StateSlots(ROWS, 3 * ROWS)))
    runner = FakeStateRunner(copy_token)
    drafter = NgramDrafter(NgramConfig(4, 1, 3), (EOS,), 4096)
    return Scheduler(cfg, runner, kv, detokenize=lambda ids: "", drafter=drafter), runner


def req(rid: str, ids: list[int], max_new: int) -> Req:
    params = SamplingParams.from_dict({"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True})
    return Req(rid=rid, input_ids=list(ids), sampling=params)


def drain(sched) -> list[Req]:
    done = []
    for _ in range(10_000):
        if sched.is_idle:
            return done
        done += [r for r in sched.step() if r.finished]
    raise AssertionError("scheduler did not drain")


def assert_whole(sched) -> None:
    sched.check_integrity()  # pages, rows, locks and snapshot slots (StateCache.check_integrity)
    assert sched.table.available == sched.table.num_rows
    states = sched.kv.states
    assert states.slots.free_count + len(sched.kv.radix.held_states()) == states.slots.count


def prompts(n: int) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(0, 90) for _ in range(9 + 7 * i)] for i in range(n)]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("mixed", [False, True])
def test_drafts_keep_states_and_snapshots_free_of_rejected_tokens(page_size, mixed):
    sched, runner = make(page_size, mixed)
    ps = prompts(4)
    for i, p in enumerate(ps):
        sched.add_request(req(f"r{i}", p, 40))
    done = {r.rid: r for r in drain(sched)}
    for i, p in enumerate(ps):
        assert done[f"r{i}"].output_ids == expected_output(p, 40, next_fn=copy_token)
    drafted, accepted = sched.drafts.spec_draft_tokens, sched.drafts.spec_accepted_tokens
    assert 0 < accepted < drafted  # drafts verified, some of their tokens rejected
    assert runner.saves > 0
    first = done["r0"]
    extended = ps[0] + first.output_ids + [5, 6, 7]
    sched.add_request(req("x", extended, 12))
    (x,) = drain(sched)
    assert x.output_ids == expected_output(extended, 12, next_fn=copy_token)
    assert x.cached_len > len(ps[0])  # continued from the finished request's decode snapshot
    assert_whole(sched)


def test_a_tight_pool_retracts_requests_with_drafts():
    sched, runner = make(4, num_slots=160, ratio=0.05)
    ps = prompts(4)
    for i, p in enumerate(ps):
        sched.add_request(req(f"r{i}", p, 30))
    done = {r.rid: r for r in drain(sched)}
    assert [done[f"r{i}"].output_ids for i in range(4)] == [expected_output(p, 30, next_fn=copy_token) for p in ps]
    assert sum(r.num_retractions for r in done.values()) > 0
    assert sched.drafts.spec_accepted_tokens > 0
    assert_whole(sched)
