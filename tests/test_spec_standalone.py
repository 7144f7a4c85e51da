"""STANDALONE speculative decoding (a draft model; docs/SPECULATIVE.md): flags refused by name; the scheduler
with a fake draft model reading the fake runner's table (the draft's view of the K/V it mirrors: whole and
the request's own tokens at every fill; outputs identical, KV whole, retraction, aborts); tiny random
checkpoints through the Engine (draft = target: everything accepted; a 1-layer draft: identical greedy
text with stop strings, logprobs, a tight pool); the embedded model with its own Q4_1 blocks as the draft."""

from __future__ import annotations

import random

import pytest

from fakes import FakeRunner, copy_token, expected_output
from radixlang_runtime.mem.allocator import PageAllocator
from radixlang_runtime.mem.radix_cache import RadixCache
from radixlang_runtime.mem.table import TableManager
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.scheduler.model_drafter import ModelDraftConfig, ModelDrafter
from radixlang_runtime.scheduler.scheduler import Scheduler, SchedulerConfig
from radixlang_runtime.server_args import ServerArgs
from test_spec_ngram import EOS, assert_whole, drain, req

GGUF = "/nonexistent/draft.gguf"  # ServerArgs checks no paths


# ---------------------------------------------------------------------------------------------- flags
def test_flags_refused_by_name():
    with pytest.raises(ValueError, match="speculative_draft_model_path"):
        ServerArgs(speculative_algorithm="STANDALONE")
    with pytest.raises(ValueError, match="speculative_num_steps \\+ 1 = 4"):
        ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF,
                   speculative_num_steps=3, speculative_num_draft_tokens=6)
    with pytest.raises(ValueError, match="speculative_ngram_max_match_window_size"):
        ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF,
                   speculative_ngram_max_match_window_size=3)
    with pytest.raises(ValueError, match="speculative_draft_model_path set with speculative_algorithm NGRAM"):
        ServerArgs(speculative_algorithm="NGRAM", speculative_draft_model_path=GGUF)
    with pytest.raises(ValueError, match="speculative_num_steps set without speculative_algorithm"):
        ServerArgs(speculative_num_steps=2)
    with pytest.raises(ValueError, match="tp_size"):
        ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF, tp_size=2)
    with pytest.raises(ValueError, match="enable_hierarchical_cache"):
        ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF,
                   enable_hierarchical_cache=True)
    with pytest.raises(ValueError, match="speculative_draft_model_quantization"):
        ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF,
                   speculative_draft_model_quantization="awq")
    with pytest.raises(ValueError, match="enable_deterministic_inference"):
        ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF,
                   enable_deterministic_inference=True)
    with pytest.raises(ValueError, match="speculative_num_steps must be in"):
        ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF, speculative_num_steps=0)
    base = ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF)
    assert base.speculative_standalone_settings() == (3, 4, 0)
    assert base.replace(speculative_num_draft_tokens=6).speculative_standalone_settings() == (5, 6, 0)


# ---------------------------------------------------------------------------------------------- scheduler
class FakeDraft:
    """propose() over FakeRunner's table (what the mirrored draft pool holds): the row, after the rewrites,
    must hold one consistent history at positions < prefix, which with the last token must be a running
    request's prompt + output. Its proposals follow copy_token, with every `wrong`-th token off by one."""

    def __init__(self, runner: FakeRunner, sched_ref: list, wrong: int = 4):
        self.runner, self.sched_ref, self.wrong, self.calls = runner, sched_ref, wrong, 0

    def __call__(self, rows, prefix_lens, last_tokens, k, rewrites):
        self.calls += 1
        fixed = dict(rewrites)
        out = []
        fills = {tuple(r.input_ids + r.output_ids) for r in self.sched_ref[0].running}
        for row, p, last in zip(rows, prefix_lens, last_tokens):
            slots = (fixed.get(row) or self.runner.rows[row])[:p]
            hist = [self.runner.slots[s][1] for s in slots]
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
        return out


def make(num_slots=4096, page_size=1, chunk=256, ratio=0.7, radix=True, mixed=False, steps=4):
    cfg = SchedulerConfig(page_size=page_size, context_len=4096, max_running_requests=32, max_prefill_tokens=512,
                          chunked_prefill_size=chunk, eos_token_ids=(EOS,), new_token_ratio_init=ratio,
                          new_token_ratio_min=0.05, new_token_ratio_decay=0.01, enable_mixed_chunk=mixed,
                          debug_check_integrity=True)
    runner = FakeRunner(copy_token)
    kv = KVManager(PageAllocator(num_slots, page_size), TableManager(32), RadixCache(page_size) if radix else None)
    ref: list = []
    draft = FakeDraft(runner, ref)
    sched = Scheduler(cfg, runner, kv, detokenize=lambda ids: "",
                      drafter=ModelDrafter(ModelDraftConfig(steps), draft, (EOS,), 4096))
    ref.append(sched)
    return sched, draft


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("mixed", [False, True])
def test_outputs_identical_and_drafts_batched(page_size, mixed):
    sched, draft = make(page_size=page_size, chunk=32, mixed=mixed)
    reqs = [req(f"r{i}", 5 + 9 * i, 30 + 3 * i) for i in range(6)]
    for r in reqs:
        sched.add_request(r)
        sched.step()
    drain(sched)
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, r.sampling.max_new_tokens, next_fn=copy_token), r.rid
    assert 0 < sched.drafts.spec_accepted_tokens < sched.drafts.spec_draft_tokens
    stats = sched.drafts.drafter.accept_stats
    assert sum(a * n for a, n in stats.histogram.items()) == sched.drafts.spec_accepted_tokens
    assert draft.calls < stats.verifications  # one draft-model run serves several requests
    assert_whole(sched)


@pytest.mark.parametrize("page_size", [1, 16])
def test_retraction_under_a_tight_pool(page_size):
    sched, _ = make(num_slots=320, page_size=page_size, ratio=0.05)
    reqs = [req(f"r{i}", 20, 40) for i in range(8)]
    for r in reqs:
        sched.add_request(r)
    drain(sched)
    assert sched.num_retracted_total > 0 and sched.drafts.spec_accepted_tokens > 0
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, 40, next_fn=copy_token), r.rid
    assert_whole(sched)


@pytest.mark.parametrize("seed", range(3))
def test_random_traffic_with_aborts_and_skipped_requests(seed):
    """Penalised / seeded / min_new_tokens requests are never drafted for; everything stays whole."""
    rng = random.Random(seed)
    sched, _ = make(num_slots=rng.choice([384, 1024]), page_size=rng.choice([1, 16]), chunk=rng.choice([32, -1]),
                    ratio=rng.choice([0.05, 0.7]), radix=seed % 2 == 0, mixed=seed % 3 == 0, steps=rng.choice([2, 5]))
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
        if r.sampling.has_penalties:
            assert r.spec_draft_tokens == 0
    assert_whole(sched)
