"""Speculation in the scheduler with a fake copying model (tests/fakes.py), for both draft sources: NGRAM
(prompt lookup, speculative/drafter.py) and STANDALONE (speculative/model_drafter.py, with FakeDraft: a fake
draft model reading the fake runner's table, i.e. the draft's view of the K/V it mirrors, which must be whole
and the request's own tokens at every fill). Per drafter: outputs identical to speculation off, a stop id
inside an accepted draft, retraction under a tight pool, random traffic with aborts and never-drafted
requests, the batch size limit; the KV whole after each."""

from __future__ import annotations

import random

import pytest

from fakes import FakeRunner, copy_token, expected_output
from scheduler_utils import assert_whole, drain
from radixlang_runtime.mem.allocator import PageAllocator
from radixlang_runtime.mem.null_cache import NullPrefixCache
from radixlang_runtime.mem.radix_cache import RadixCache
from radixlang_runtime.mem.table import TableManager
from radixlang_runtime.protocol.sampling_params import SamplingParams
from radixlang_runtime.speculative.drafter import NgramConfig, NgramDrafter
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.speculative.model_drafter import ModelDraftConfig, ModelDrafter
from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.scheduler.scheduler import Scheduler, SchedulerConfig

EOS = 96
DRAFTERS = ["ngram", "standalone"]


class FakeDraft:
    """propose() over FakeRunner's table (what the mirrored draft pool holds): the row, after the rewrites,
    must hold one consistent history at positions < prefix, which with the last token must be a running
    request's prompt + output. Its proposals follow copy_token, with every `wrong`-th token off by one."""

    def __init__(self, runner: FakeRunner, sched_ref: list, wrong: int = 4):
        self.runner, self.sched_ref, self.wrong, self.calls = runner, sched_ref, wrong, 0

    def __call__(self, rows, prefix_lens, last_tokens, k, rewrites, kv_slots, history):
        self.calls += 1
        fixed = dict(rewrites)
        out = []
        fills = {tuple(r.input_ids + r.output_ids) for r in self.sched_ref[0].running}
        for b, (row, p, last) in enumerate(zip(rows, prefix_lens, last_tokens)):
            slots = (fixed.get(row) or self.runner.rows[row])[:p]
            assert list(kv_slots[b][:p]) == list(slots), "kv_slots are not the request's slots"
            hist = [self.runner.slots[s][1] for s in slots]
            assert list(history(b)[:p]) == hist and history(b)[p] == last, "history is not the request's tokens"
            for pos, s in enumerate(slots):
                assert self.runner.slots[s] == (pos, hist[pos], hash(tuple(hist[:pos + 1]))), "draft K/V not whole"
            fill = hist + [last]
            assert tuple(fill) in fills, "the draft's table row is not a running request's tokens"
            toks = []
            for j in range(k):
                t = copy_token(fill)
                if (len(fill) + j) % self.wrong == 0:
                    t = (t + 1) % 90
                toks.append(t)
                fill = fill + [t]
            out.append(toks)
        return out, 0.0


def make(drafter="ngram", num_slots=4096, page_size=1, chunk=256, ratio=0.7, radix=True, mixed=False, k=4,
         row_cost=0.0):
    """(scheduler, runner, FakeDraft or None); drafter None: no speculation. k: NGRAM's num_draft_tokens, or
    STANDALONE's num_steps; row_cost: NGRAM's cost rule prior (0: off)."""
    cfg = SchedulerConfig(page_size=page_size, context_len=4096, max_running_requests=32, max_prefill_tokens=512,
                          chunked_prefill_size=chunk, eos_token_ids=(EOS,), new_token_ratio_init=ratio,
                          new_token_ratio_min=0.05, new_token_ratio_decay=0.01, enable_mixed_chunk=mixed,
                          debug_check_integrity=True)
    runner = FakeRunner(copy_token)
    kv = KVManager(PageAllocator(num_slots, page_size), TableManager(32),
                   RadixCache(page_size) if radix else NullPrefixCache(page_size))
    ref: list = []
    draft = FakeDraft(runner, ref) if drafter == "standalone" else None
    source = {None: None, "ngram": lambda: NgramDrafter(NgramConfig(k, 1, 3, row_cost=row_cost), (EOS,), 4096),
              "standalone": lambda: ModelDrafter(ModelDraftConfig(k), draft, (EOS,), 4096)}[drafter]
    sched = Scheduler(cfg, runner, kv, detokenize=lambda ids: "", drafter=source() if source else None)
    ref.append(sched)
    return sched, runner, draft


def req(rid, n_prompt, max_new, **sp) -> Req:
    rng = random.Random(rid)
    ids = [rng.randrange(0, 90) for _ in range(n_prompt)]
    params = SamplingParams.from_dict({"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True, **sp})
    return Req(rid=rid, input_ids=ids, sampling=params)


def _no_more(sched, draft) -> None:
    """NGRAM: nothing beyond the shared checks."""


def _batched(sched, draft) -> None:
    """STANDALONE: the accept histogram adds up, and one draft-model run serves several requests."""
    stats = sched.drafts.drafter.accept_stats
    assert sum(a * n for a, n in stats.histogram.items()) == sched.drafts.spec_accepted_tokens
    assert draft.calls < stats.verifications


DRAFTER_CHECKS = {"ngram": _no_more, "standalone": _batched}


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("mixed", [False, True])
def test_outputs_identical_with_speculation(drafter, page_size, mixed):
    sched, runner, draft = make(drafter, page_size=page_size, chunk=32, mixed=mixed)
    reqs = [req(f"r{i}", 5 + 9 * i, 30 + 3 * i) for i in range(6)]
    for r in reqs:
        sched.add_request(r)
        for _ in range(2):
            sched.step()
    drain(sched)
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, r.sampling.max_new_tokens, next_fn=copy_token), r.rid
        assert r.finished_reason == {"type": "length", "length": r.sampling.max_new_tokens}
    assert 0 < sched.drafts.spec_accepted_tokens < sched.drafts.spec_draft_tokens  # accepted and rejected both ran
    assert sum(r.spec_accepted_tokens for r in reqs) == sched.drafts.spec_accepted_tokens
    steps = sum(1 for p, _, _ in runner.batches if p != "extend")
    assert steps < sum(r.sampling.max_new_tokens for r in reqs) / 2  # fewer decode passes than tokens
    DRAFTER_CHECKS[drafter](sched, draft)
    assert_whole(sched)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_stop_id_inside_an_accepted_draft(drafter):
    """A stop token id accepted mid-draft ends the request there, as token-by-token decoding does."""
    free = make(None)[0]
    probe = req("p", 12, 60)
    free.add_request(probe)
    drain(free)
    stop = probe.output_ids[40]  # a token the copying model produces late
    sched = make(drafter)[0]
    r = req("p", 12, 60, stop_token_ids=[stop])
    sched.add_request(r)
    drain(sched)
    assert r.output_ids == expected_output(r.input_ids, 60, (stop,), next_fn=copy_token)
    assert r.finished_reason == {"type": "stop", "matched": stop}
    assert sched.drafts.spec_accepted_tokens > 0
    assert_whole(sched)


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("page_size", [1, 16])
def test_retraction_under_a_tight_pool(drafter, page_size):
    sched = make(drafter, num_slots=320, page_size=page_size, ratio=0.05)[0]
    reqs = [req(f"r{i}", 20, 40) for i in range(8)]
    for r in reqs:
        sched.add_request(r)
    drain(sched)
    assert sched.num_retracted_total > 0 and sched.drafts.spec_accepted_tokens > 0
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, 40, next_fn=copy_token), r.rid
    assert_whole(sched)


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("seed", range(4))
def test_random_traffic_with_aborts_and_skipped_requests(drafter, seed):
    """Penalised / min_new_tokens requests are never drafted for; everything stays whole."""
    rng = random.Random(seed)
    sched = make(drafter, num_slots=rng.choice([384, 1024]), page_size=rng.choice([1, 16]), chunk=rng.choice([32, -1]),
                 ratio=rng.choice([0.05, 0.7]), radix=seed % 2 == 0, mixed=seed % 3 == 0, k=rng.choice([2, 5, 6]))[0]
    reqs, aborted, skipped = [], set(), []
    for _ in range(300):
        if len(reqs) + len(skipped) < 25 and rng.random() < 0.3:
            extra = rng.choice([{}, {}, {"min_new_tokens": 1}, {"frequency_penalty": 0.5}])
            r = req(f"q{seed}.{len(reqs) + len(skipped)}", rng.randrange(1, 60), rng.randrange(1, 50), **extra)
            (skipped if extra else reqs).append(r)
            sched.add_request(r)
        if reqs and rng.random() < 0.03:
            victim = rng.choice(reqs)
            aborted.add(victim.rid)
            sched.abort(victim.rid)
        sched.step()
    drain(sched)
    for r in reqs:
        if r.finished_reason["type"] == "abort":
            assert r.rid in aborted
            continue
        assert r.output_ids == expected_output(r.input_ids, r.sampling.max_new_tokens, next_fn=copy_token), r.rid
    for r in skipped:  # never aborted (victims come from reqs); FakeRunner ignores penalties
        assert r.output_ids == expected_output(r.input_ids, r.sampling.max_new_tokens, next_fn=copy_token), \
            (r.rid, r.finished_reason, r.sampling)
    assert all(r.spec_draft_tokens == 0 for r in skipped if r.sampling.has_penalties)
    assert_whole(sched)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_large_batches_do_not_speculate(drafter):
    sched = make(drafter)[0]
    sched.drafts.drafter.cfg.disable_batch_size = 2
    reqs = [req(f"b{i}", 10, 30) for i in range(4)]
    for r in reqs:
        sched.add_request(r)
    drain(sched)
    assert sched.drafts.spec_draft_tokens == 0
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, 30, next_fn=copy_token)
    assert_whole(sched)


def test_ngram_cost_rule_records_every_all_decode_step():
    """With the cost rule on (row_cost > 0), every step where all requests decode is a sample of the step cost
    model (speculative/spec_cost.py), prefill steps are not; outputs stay exact whatever the timings were."""
    sched, runner, _ = make("ngram", row_cost=0.13)
    reqs = [req(f"c{i}", 10, 30) for i in range(3)]
    for r in reqs:
        sched.add_request(r)
    drain(sched)
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, 30, next_fn=copy_token)
    assert sched.drafts.cost.samples == sum(1 for p, _, _ in runner.batches if p != "extend") > 0
    assert_whole(sched)
