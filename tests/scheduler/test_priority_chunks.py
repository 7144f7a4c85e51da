"""Priority scheduling and chunked prefill over the FakeRunner (preemption.yield_chunk_for_head): a prompt mid-way
through its chunks goes back to the waiting queue when a request that outranks it arrives (higher first, or lower
with low_values_first), the arrival takes the next prefill, and the prompt resumes from the pages the radix cache
kept (recomputing only what eviction took; a hybrid model's from the state snapshot at its last chunk's end); its
input logprobs come once. Every output is the one the request has alone (fakes.expected_output) and the one a run
without priority scheduling gives; the allocator is whole after each scenario, with and without the overlap
schedule. Without a rule nothing yields."""

from __future__ import annotations

import pytest

from fakes import FakeRunner, FakeStateRunner, expected_output
from scheduler_utils import assert_whole, drain, make, req

from radixlang_runtime.mem.state_slots import StateSlots
from radixlang_runtime.model.executor.step_io import StepLogprobs
from radixlang_runtime.pooling import PooledSum, PoolSpec
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.scheduler.overlap import OverlapSchedule
from radixlang_runtime.scheduler.preemption import PriorityRule, forget_prompt_results
from radixlang_runtime.scheduler.scheduler import Scheduler
from radixlang_runtime.scheduler.state_cache import StateCache

CHUNK = 64


def scheduler(rule, overlap=False, **make_kw):
    sched, runner = make(chunk=CHUNK, max_prefill=CHUNK, **make_kw)
    sched.cfg.priority = rule
    if overlap:
        sched.overlap = OverlapSchedule(sched)
    return sched, runner


def ranked(r, priority: int, low_first: bool):
    """r at `priority` in the rule's direction (larger: more urgent)."""
    r.priority = -priority if low_first else priority
    return r


def chunk_until(sched, r, kv_len: int) -> None:
    """Step until r has kv_len positions allocated, mid-way through its chunked prefill."""
    sched.add_request(r)
    for _ in range(50):
        if r.kv_len >= kv_len:
            break
        sched.step()
    assert r.kv_len == kv_len and sched.chunked_req is r


def assert_solo_outputs(sched, reqs) -> list[str]:
    done = drain(sched)
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, r.sampling.max_new_tokens), r.rid
    assert_whole(sched)
    return [r.rid for r in done]


def scenario(rule, low_first=False, **kw):
    """A 400-token prompt of priority 0 two chunks in, then a 100-token one of priority 5 (longer than half a chunk,
    so without a yield it waits for every remaining chunk). The scheduler, both requests and the step's state."""
    sched, _ = scheduler(rule, **kw)
    low = ranked(req("low", 400, 6), 0, low_first)
    high = ranked(req("high", 100, 6), 5, low_first)
    chunk_until(sched, low, 2 * CHUNK)
    sched.add_request(high)
    sched.step()
    return sched, low, high


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("low_first", [False, True])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_an_outranking_arrival_takes_the_next_chunk_and_the_prompt_resumes_from_its_cache(page_size, low_first,
                                                                                        overlap, policy):
    sched, low, high = scenario(PriorityRule(low_values_first=low_first), low_first, overlap=overlap,
                                page_size=page_size, policy=policy)
    assert sched.chunked_req is high and high.kv_len == CHUNK  # high's first chunk took this step's budget
    assert low in sched.waiting and low.kv_len == 0 and low.table_idx == -1  # its pages went to the cache
    assert sched.kv.radix.match_prefix(low.cache_ids).length == 2 * CHUNK
    assert sched.num_preempted_total == 1 and sched.num_retracted_total == 1 and low.num_retractions == 1
    assert_solo_outputs(sched, [low, high])
    # the prefilled chunks were read back from the cache, not computed again
    assert sched.admission.prefill_tokens_computed == 400 + 100
    assert low.cached_len == 0 and high.cached_len == 0  # its own pages are no cache hit of its first admission
    assert sched.num_preempted_total == 1


@pytest.mark.parametrize("page_size", [1, 16])
def test_without_a_rule_the_chunked_prompt_keeps_every_chunk_and_outputs_agree(page_size):
    plain, low0, high0 = scenario(None, page_size=page_size)
    assert plain.chunked_req is low0 and low0.kv_len == 3 * CHUNK and high0.kv_len == 0
    assert_solo_outputs(plain, [low0, high0])
    assert plain.num_preempted_total == 0 and plain.num_retracted_total == 0
    ranked_sched, low1, high1 = scenario(PriorityRule(), page_size=page_size)
    assert ranked_sched.num_preempted_total == 1
    assert_solo_outputs(ranked_sched, [low1, high1])
    assert (low1.output_ids, high1.output_ids) == (low0.output_ids, high0.output_ids)


@pytest.mark.parametrize("low_first", [False, True])
def test_an_equal_or_lower_arrival_waits_for_the_chunks(low_first):
    sched, _ = scheduler(PriorityRule(low_values_first=low_first))
    low = ranked(req("low", 400, 6), 3, low_first)
    chunk_until(sched, low, 2 * CHUNK)
    for rid, p in (("same", 3), ("lower", 0)):
        sched.add_request(ranked(req(rid, 100, 6), p, low_first))
    sched.step()
    assert sched.chunked_req is low and low.kv_len == 3 * CHUNK
    assert sched.num_preempted_total == 0
    assert assert_solo_outputs(sched, [low, *sched.waiting])[0] == "low"


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_yielded_prompt_whose_pages_were_evicted_computes_them_again(page_size):
    """A pool the arrival fills: it evicts the yielded prompt's cached chunks, which are then computed again."""
    sched, _ = scheduler(PriorityRule(), num_slots=256, page_size=page_size)
    low = ranked(req("low", 200, 4), 0, False)
    high = ranked(req("high", 200, 4), 1, False)
    chunk_until(sched, low, 2 * CHUNK)
    sched.add_request(high)
    assert_solo_outputs(sched, [low, high])
    assert sched.num_preempted_total == 1
    assert sched.admission.prefill_tokens_computed > 400  # some of low's chunks ran twice


def test_a_hybrid_prompt_resumes_from_the_state_snapshot_at_its_last_chunk():
    """A hybrid model (FakeStateRunner checks every step starts from the right recurrent state): the yielded
    prompt's state at its last chunk's end is a snapshot of the cache, and it continues from there."""
    plain, _ = make(page_size=4, rows=8)
    states = StateCache(plain.kv.radix, StateSlots(8, 16))
    kv = KVManager(plain.kv.allocator, plain.kv.table, plain.kv.radix, states=states)
    sched = Scheduler(plain.cfg, FakeStateRunner(), kv, detokenize=lambda ids: "")
    sched.cfg.chunked_prefill_size = sched.cfg.max_prefill_tokens = CHUNK
    sched.cfg.priority = PriorityRule()
    low, high = ranked(req("low", 400, 6), 0, False), ranked(req("high", 100, 6), 1, False)
    chunk_until(sched, low, 2 * CHUNK)
    sched.add_request(high)
    assert_solo_outputs(sched, [low, high])
    assert sched.num_preempted_total == 1
    assert sched.admission.prefill_tokens_computed == 400 + 100
    assert states.slots.free_count + len(kv.radix.held_states()) == states.slots.count


class LogprobRunner(FakeRunner):
    """The FakeRunner returning input logprobs whose value is their position: a position returned twice shows."""

    def forward(self, batch):
        result = super().forward(batch)
        for i, spec in enumerate(batch.input_logprobs):
            if spec is not None:
                p, n = batch.prefix_lens[i], len(batch.extend_ids[i])
                lo, hi = max(p, spec.start), min(p + n - 1, len(spec.prompt_ids) - 2)
                result.logprobs[i] = StepLogprobs(input_vals=[float(x) for x in range(lo, hi + 1)])
        return result


@pytest.mark.parametrize("start", [0, 100])
def test_a_yielded_prompt_returns_each_input_logprob_once(start):
    sched, _ = scheduler(PriorityRule())
    sched.runner = LogprobRunner()
    low = ranked(req("low", 400, 4), 0, False)
    low.return_logprob, low.logprob_start_len = True, start
    chunk_until(sched, low, 3 * CHUNK)
    assert low.input_logprobs  # chunks before the yield returned some
    sched.add_request(ranked(req("high", 100, 4), 1, False))
    assert_solo_outputs(sched, [low])
    assert sched.num_preempted_total == 1
    assert low.input_logprobs == [float(p) for p in range(start, 399)]


def test_forgetting_a_prompts_results_restarts_its_pooled_sum():
    r = req("emb", 40, 0)
    r.pooled = PooledSum(PoolSpec("mean", ()))
    r.pooled.add([1.0, 3.0], 32)
    r.input_logprobs, r.input_ranks = [-0.5], [1]
    forget_prompt_results(r)
    assert r.pooled.vec is None and r.pooled.rows == 0 and r.pooled.spec.mode == "mean"
    assert r.input_logprobs == [] and r.input_ranks == []


@pytest.mark.parametrize("adapter, yields", [(2, False), (1, True)])
def test_an_arrival_waiting_for_an_adapter_slot_takes_no_chunk(adapter, yields):
    """max_loras_per_batch 1 with adapter 1 decoding: an outranking arrival on adapter 2 could not run, so the
    chunked prompt keeps its chunks (else it would yield and come back every step); on adapter 1 it can."""
    sched, _ = scheduler(PriorityRule())
    sched.cfg.max_loras_per_batch = 1
    busy = req("busy", 40, 120)
    busy.lora_id = 1
    sched.add_request(busy)
    sched.step()
    low = ranked(req("low", 400, 6), 0, False)
    chunk_until(sched, low, 2 * CHUNK)
    high = ranked(req("high", 100, 6), 5, False)
    high.lora_id = adapter
    sched.add_request(high)
    sched.step()
    sched.step()  # busy decodes between chunks: one of the two steps is a prefill
    assert (sched.chunked_req is low) is not yields
    assert sched.num_preempted_total == int(yields)
    assert_solo_outputs(sched, [busy, low, high])
    assert sched.num_preempted_total == int(yields)
