"""Swap-on-retract: retract_decode swaps a retracted request's whole records out to the
hicache tiers; readmission keeps what L1 still holds, loads what the tiers hold, recomputes the rest.
The scheduler runs on FakeRunner (tests/fakes.py), whose slots hold (position, token, history hash): a
swapped-in record with foreign or stale K/V fails its checks. Then once on the real model (float32)."""

from __future__ import annotations

import pickle

import pytest
from fakes import FakeRunner, expected_output
from scheduler_utils import assert_whole, drain, req

from radixlang_runtime.mem.allocator import PageAllocator
from radixlang_runtime.mem.hicache import HiCache, HiCacheConfig
from radixlang_runtime.mem.radix_cache import RadixCache
from radixlang_runtime.mem.table import TableManager
from radixlang_runtime.mem.tiers.disk import DiskTier
from radixlang_runtime.mem.tiers.keys import KVFingerprint
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.scheduler.scheduler import Scheduler, SchedulerConfig
from radixlang_runtime.server_args import ServerArgs

T = 8  # record tokens
PAGE = 4


class RunnerPort:
    """The hicache's pool side over FakeRunner's slots: a record's payload is its slots' entries, pickled."""

    def __init__(self, runner: FakeRunner):
        self.runner = runner

    def read_records(self, slots):
        return [pickle.dumps([self.runner.slots.get(s) for s in slots[i:i + T]]) for i in range(0, len(slots), T)]

    def write_records(self, slots, payloads):
        entries = [e for p in payloads for e in pickle.loads(p)]
        assert len(entries) == len(slots)
        for s, e in zip(slots, entries):
            self.runner.slots[s] = e


def make(tmp_path, l2_bytes=1 << 24, load_policy="always", hicache=True, preemption_mode="swap"):
    cfg = SchedulerConfig(page_size=PAGE, context_len=4096, max_running_requests=32, max_prefill_tokens=512,
                          chunked_prefill_size=256, eos_token_ids=(96,), new_token_ratio_init=0.05,
                          new_token_ratio_min=0.05, new_token_ratio_decay=0.01, debug_check_integrity=True)
    runner = FakeRunner()
    hc = None
    if hicache:
        hc = HiCache(HiCacheConfig(T, load_policy=load_policy, preemption_mode=preemption_mode),
                     KVFingerprint("fake", "f", PAGE, T, 1, 1, 1),
                     RunnerPort(runner), DiskTier(str(tmp_path / "l2"), l2_bytes), None)
    kv = KVManager(PageAllocator(256, PAGE), TableManager(32), RadixCache(PAGE), hicache=hc)
    return Scheduler(cfg, runner, kv, detokenize=lambda ids: ""), hc


def run(sched, hc=None, n=10):
    """10 requests of 20 + 48 tokens need 680 slots; the pool has 256: decode retracts, eviction follows.
    With a hicache, its writer drains after every step: which records a readmission finds in the writer's
    queue, in L2 or nowhere must not depend on how fast the writer thread ran on a loaded machine."""
    reqs = [req(f"r{i}", 20, 48, seed=3) for i in range(n)]
    for r in reqs:
        sched.add_request(r)
    if hc is None:
        drain(sched)
        return reqs
    for _ in range(10_000):
        if sched.is_idle:
            return reqs
        sched.step()
        assert hc.writer.drain(10)
    raise AssertionError("scheduler did not drain")


def test_retracted_requests_swap_their_kv_back_in(tmp_path):
    sched, hc = make(tmp_path)
    reqs = run(sched, hc)
    assert sched.num_retracted_total > 0
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, 48), r.rid
    tokens = sched.admission.readmit_tokens
    assert tokens["swapped"] > 0  # records eviction took from L1 came back from the tiers, checked by the runner
    assert hc.swap_out_tokens["out"] >= tokens["swapped"] and hc.swap_out_tokens["dropped"] == 0
    # each readmission recomputes at most its tail past the last whole record (< T) and its last position
    assert tokens["recomputed"] <= sum(r.num_retractions for r in reqs) * T
    assert_whole(sched)
    assert hc.writer.drain(10)
    hc.check_integrity(deep=True)
    hc.close()


def test_records_the_tiers_lost_are_recomputed(tmp_path):
    sched, hc = make(tmp_path, l2_bytes=3 * (36 + 600))  # L2 keeps ~3 records: most swapped ones are lost
    reqs = run(sched, hc)
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, 48), r.rid
    tokens = sched.admission.readmit_tokens
    assert tokens["recomputed"] > sum(r.num_retractions for r in reqs) * T  # more than the tails
    assert_whole(sched)
    assert hc.writer.drain(10)
    hc.check_integrity(deep=True)
    hc.close()


def test_no_swap_out_when_recomputing_is_measured_cheaper(tmp_path):
    sched, hc = make(tmp_path, load_policy="faster")
    hc.costs.note_prefill(1000, 1e-9)  # recomputing looks free
    hc.costs.note_load("l2", T, 1.0)
    reqs = run(sched, hc)
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, 48), r.rid
    assert sched.num_retracted_total > 0
    assert hc.swap_out_tokens["out"] == 0 and hc.swap_out_tokens["skipped"] > 0
    assert_whole(sched)
    hc.close()


def test_without_tiers_readmission_recomputes_what_l1_lost(tmp_path):
    sched, _ = make(tmp_path, hicache=False)
    reqs = run(sched)
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, 48), r.rid
    tokens = sched.admission.readmit_tokens
    assert tokens["swapped"] == 0 and tokens["recomputed"] > 0
    assert_whole(sched)


def test_preemption_mode_recompute_swaps_nothing_out(tmp_path):
    sched, hc = make(tmp_path, preemption_mode="recompute")
    reqs = run(sched, hc)
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, 48), r.rid
    assert sched.num_retracted_total > 0
    assert hc.swap_out_tokens == {"out": 0, "skipped": 0, "dropped": 0}  # retraction never called the tiers
    assert hc.stats()["preemption_mode"] == "recompute"
    # (a readmission may still load what eviction's own write_back backup stored: not asserted either way)
    assert_whole(sched)
    assert hc.writer.drain(10)
    hc.check_integrity(deep=True)
    hc.close()


def test_preemption_mode_flag_parses_and_is_refused_where_it_cannot_apply():
    from radixlang_runtime.server_cli import parse_server_args

    assert parse_server_args([]).preemption_mode is None  # swap with tiers, else recompute
    a = parse_server_args(["--enable-hierarchical-cache", "--preemption-mode", "recompute"])
    assert a.preemption_mode == "recompute"
    assert ServerArgs(preemption_mode="recompute").preemption_mode == "recompute"  # what no tiers does anyway
    assert ServerArgs(enable_hierarchical_cache=True, preemption_mode="swap").preemption_mode == "swap"
    with pytest.raises(ValueError, match="preemption_mode swap needs enable_hierarchical_cache"):
        ServerArgs(preemption_mode="swap")
    with pytest.raises(ValueError, match="preemption_mode must be swap or recompute; got 'offload'"):
        ServerArgs(enable_hierarchical_cache=True, preemption_mode="offload")
    with pytest.raises(ValueError, match="preemption_mode must be one of swap, recompute"):
        HiCacheConfig(T, preemption_mode="never")
