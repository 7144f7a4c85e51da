"""A scheduler over the FakeRunner (fakes.py) with the real allocator, radix cache and tables, and the checks
the scheduler tests share."""

from __future__ import annotations

import random

from fakes import FakeRunner
from radixlang_runtime.mem.allocator import PageAllocator
from radixlang_runtime.mem.null_cache import NullPrefixCache
from radixlang_runtime.mem.radix_cache import RadixCache
from radixlang_runtime.mem.table import TableManager
from radixlang_runtime.protocol.sampling_params import SamplingParams
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.scheduler.scheduler import Scheduler, SchedulerConfig

EOS = 96  # FakeRunner's vocabulary is 0..96


def make(num_slots=4096, page_size=1, rows=32, max_prefill=512, chunk=256, ratio=0.7, eos=EOS, radix=True,
         policy="fcfs"):
    cfg = SchedulerConfig(page_size=page_size, context_len=4096, max_running_requests=rows,
                          max_prefill_tokens=max_prefill, chunked_prefill_size=chunk, eos_token_ids=(eos,),
                          new_token_ratio_init=ratio, new_token_ratio_min=0.05, new_token_ratio_decay=0.01,
                          schedule_policy=policy, debug_check_integrity=True)
    runner = FakeRunner()
    cache = RadixCache(page_size) if radix else NullPrefixCache(page_size)
    kv = KVManager(PageAllocator(num_slots, page_size), TableManager(rows), cache)
    sched = Scheduler(cfg, runner, kv, detokenize=lambda ids: "")
    return sched, runner


def req(rid, n_prompt, max_new, seed=0, **sp) -> Req:
    rng = random.Random(f"{rid}/{seed}")  # str seeds are stable across processes (hash() is not)
    ids = [rng.randrange(0, 90) for _ in range(n_prompt)]
    params = SamplingParams.from_dict({"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True, **sp})
    return Req(rid=rid, input_ids=ids, sampling=params)


def drain(sched, limit=10_000):
    finished = []
    for _ in range(limit):
        if sched.is_idle:
            return finished
        finished += [r for r in sched.step() if r.finished]
    raise AssertionError("scheduler did not drain")


def assert_whole(sched):
    """Idle: every page free or cached (nothing locked), every row free."""
    sched.check_integrity()
    assert sched.allocator.available_size() + sched.kv.cached_size() == sched.allocator.total_slots
    assert sched.kv.evictable_size() == sched.kv.cached_size()
    assert sched.table.available == sched.table.num_rows
