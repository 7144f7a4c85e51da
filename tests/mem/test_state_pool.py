"""Hybrid models' state slots and the prefix cache's state snapshots, torch-free: the snapshot slots, the radix
nodes holding them, and the scheduler with a fake runner whose every step checks it continues from the right
state (tests/fakes.FakeStateRunner)."""

from __future__ import annotations

import random

import pytest

from fakes import FakeStateRunner, expected_output
from radixlang_runtime.mem.allocator import PageAllocator
from radixlang_runtime.mem.radix_cache import RadixCache
from radixlang_runtime.mem.state_slots import StateSlots
from radixlang_runtime.mem.table import TableManager
from radixlang_runtime.protocol.sampling_params import SamplingParams
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.scheduler.scheduler import Scheduler, SchedulerConfig
from radixlang_runtime.scheduler.state_cache import StateCache

EOS = 96


def test_state_slots_alloc_free_and_integrity():
    slots = StateSlots(first=4, count=3)
    got = [slots.alloc() for _ in range(3)]
    assert sorted(got) == [4, 5, 6] and slots.alloc() is None
    slots.check_integrity(held=got)
    with pytest.raises(AssertionError, match="held 2 != 3"):
        slots.check_integrity(held=got[:2])
    slots.free([got[0]])
    with pytest.raises(AssertionError, match="twice"):
        slots.check_integrity(held=got)
    with pytest.raises(AssertionError, match="not a snapshot slot"):
        slots.free([0])


def test_match_stops_at_the_deepest_snapshot_and_eviction_frees_it():
    radix = RadixCache(page_size=1)
    radix.insert(list(range(10)), list(range(10)))
    node = radix.match_prefix(list(range(6))).last_node  # splits at 6
    node.state = 100
    m = radix.match_prefix(list(range(9)))
    assert m.length == 9
    anc, depth = radix.state_ancestor(m.last_node)
    assert (anc, depth) == (node, 6)
    assert radix.state_ancestor(radix.match_prefix([0, 1]).last_node) == (radix.root, 0)
    radix.lock(node)
    assert radix.drop_states(5) == []  # locked: kept
    radix.unlock(node)
    radix.evict(10)  # the whole tree, snapshot with its node
    assert radix.freed_states == [100] and radix.held_states() == []


def test_drop_states_takes_least_recently_used_first():
    radix = RadixCache(page_size=1)
    radix.insert([1, 2, 3], [0, 1, 2])
    radix.insert([7, 8, 9], [3, 4, 5])
    radix.match_prefix([1, 2, 3]).last_node.state = 10
    radix.match_prefix([7, 8, 9]).last_node.state = 11  # used last
    assert radix.drop_states(1) == [10]
    assert radix.held_states() == [11]


def make(num_slots=4096, page_size=1, rows=8, snapshots=16, chunk=64, max_prefill=256, ratio=0.7):
    cfg = SchedulerConfig(page_size=page_size, context_len=4096, max_running_requests=rows,
                          max_prefill_tokens=max_prefill, chunked_prefill_size=chunk, eos_token_ids=(EOS,),
                          new_token_ratio_init=ratio, new_token_ratio_min=0.05, new_token_ratio_decay=0.01,
                          schedule_policy="fcfs", debug_check_integrity=True)
    radix = RadixCache(page_size)
    states = StateCache(radix, StateSlots(rows, snapshots))
    kv = KVManager(PageAllocator(num_slots, page_size), TableManager(rows), radix, states=states)
    runner = FakeStateRunner()
    return Scheduler(cfg, runner, kv, detokenize=lambda ids: ""), runner


def req(rid, ids, max_new) -> Req:
    params = SamplingParams.from_dict({"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True})
    return Req(rid=rid, input_ids=list(ids), sampling=params)


def drain(sched, limit=10_000):
    done = []
    for _ in range(limit):
        if sched.is_idle:
            return done
        done += [r for r in sched.step() if r.finished]
    raise AssertionError("scheduler did not drain")


def assert_whole(sched):
    sched.check_integrity()  # pages, rows, locks and snapshot slots (StateCache.check_integrity)
    assert sched.table.available == sched.table.num_rows
    states = sched.kv.states
    assert states.slots.free_count + len(sched.kv.radix.held_states()) == states.slots.count


@pytest.mark.parametrize("page_size", [1, 4])
def test_an_extension_continues_from_a_snapshot(page_size):
    sched, runner = make(page_size=page_size, chunk=32)
    rng = random.Random(1)
    first = [rng.randrange(0, 90) for _ in range(100)]
    sched.add_request(req("a", first, 6))
    (a,) = drain(sched)
    assert a.output_ids == expected_output(first, 6)
    assert a.cached_len == 0
    second = first + a.output_ids + [5, 6, 7]
    sched.add_request(req("b", second, 6))
    (b,) = drain(sched)
    assert b.output_ids == expected_output(second, 6)
    # the first turn's last page boundary (its finish: decode rows save there), not its prompt's end (100)
    assert b.cached_len == (100 + 6 - 1) // page_size * page_size
    assert runner.loads >= 1 and runner.saves >= 5  # chunks of 32: snapshots at 32, 64, 96, 100, and in decode
    sibling = first + [7, 7, 7]  # another continuation of the first prompt: its prompt-end snapshot
    sched.add_request(req("c", sibling, 2))
    (c,) = drain(sched)
    assert c.output_ids == expected_output(sibling, 2) and c.cached_len == 100
    assert_whole(sched)


def test_a_decoding_request_keeps_one_snapshot_slot():
    """Each page boundary a decode crosses overwrites the request's one pending snapshot; the finish attaches it."""
    sched, runner = make(page_size=4, chunk=32, snapshots=4)
    sched.add_request(req("a", list(range(10, 30)), 23))  # prompt 20 (a snapshot at 20), decode to 42
    while not sched.is_idle:
        sched.step()
        live = [r for r in sched.running if r.pending_state is not None]
        held = len(sched.kv.radix.held_states())
        assert len(live) <= 1 and sched.kv.states.slots.free_count == 4 - held - len(live)
    assert sorted(len(n) for n in _snapshot_keys(sched)) == [20, 40]  # the prompt's end; the finish's boundary
    assert_whole(sched)


def _snapshot_keys(sched) -> list[list[int]]:
    """The token path of every radix node holding a snapshot."""
    out = []

    def walk(node, path):
        for child in node.children.values():
            p = path + list(child.key)
            if child.state is not None:
                out.append(p)
            walk(child, p)
    walk(sched.kv.radix.root, [])
    return out


def test_a_prefix_without_a_snapshot_is_recomputed():
    """A shared prefix whose K/V is cached but whose end has no snapshot: the match stops at a snapshot."""
    sched, runner = make(chunk=64)
    rng = random.Random(2)
    base = [rng.randrange(0, 90) for _ in range(80)]
    sched.add_request(req("a", base, 2))
    drain(sched)
    other = base[:50] + [1, 2, 3]  # diverges before the first snapshot (64, the first chunk's end)
    sched.add_request(req("b", other, 3))
    (b,) = drain(sched)
    assert b.output_ids == expected_output(other, 3)
    assert b.cached_len == 0  # the tree holds 50 tokens of K/V, but no state before position 64
    assert_whole(sched)


@pytest.mark.parametrize("seed, mixed", [(0, False), (1, False), (2, True)])
def test_random_traffic_with_retraction_and_few_snapshot_slots(seed, mixed):
    """Shared prefixes, extensions of finished requests, a pool small enough to retract, two snapshot slots
    (with mixed, decode rows ride in the prefill steps): every output is the request's solo output and every
    step starts from the right state."""
    sched, runner = make(num_slots=256, page_size=4, rows=8, snapshots=2, chunk=24, max_prefill=48, ratio=0.05)
    sched.cfg.enable_mixed_chunk = mixed
    rng = random.Random(seed)
    bases = [[rng.randrange(0, 90) for _ in range(rng.randrange(20, 60))] for _ in range(3)]
    want = {}
    for i in range(24):
        ids = rng.choice(bases)[: rng.randrange(8, 60)] + [rng.randrange(0, 90) for _ in range(rng.randrange(1, 20))]
        n = rng.randrange(10, 50)
        want[f"r{i}"] = expected_output(ids, n)
        sched.add_request(req(f"r{i}", ids, n))
        if i == 12:  # later requests find the first ones' snapshots
            for r in drain(sched):
                assert r.output_ids == want[r.rid]
    for r in drain(sched):
        assert r.output_ids == want[r.rid]
    assert sched.num_retracted_total > 0  # the pool was tight enough to retract
    assert runner.loads > 0
    assert any(phase == "mixed" for phase, _, _ in runner.batches) == mixed
    assert_whole(sched)


def test_abort_frees_a_pending_snapshot_and_the_state_slot():
    sched, _ = make(chunk=16)
    sched.add_request(req("a", list(range(60)), 20))
    sched.step()  # the first chunk (a snapshot attached at 16)
    assert sched.kv.states.slots.free_count < sched.kv.states.slots.count
    sched.abort("a")
    drain(sched)
    assert_whole(sched)
