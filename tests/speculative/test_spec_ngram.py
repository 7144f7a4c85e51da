"""N-gram speculative decoding (speculative/drafter.py): the drafter against a brute-force reference, the cost
rule, and the real embedded model through the Engine (greedy text, stop strings and logprobs identical with
it on). The scheduler with a fake copying model: tests/speculative/test_spec_scheduler.py, shared with STANDALONE."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from browser_utils import browser, chromium
from conftest import running_engine
from radixlang_runtime.mem.radix_cache import RadixCache
from radixlang_runtime.protocol.sampling_params import SamplingParams
from radixlang_runtime.speculative.drafter import (MATCH_CAP, ROW_COST, MatchAgreement, NgramConfig, NgramDrafter,
                                                 NgramIndex, trim_to_cost)
from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.server_args import ServerArgs

EOS = 96


# ---------------------------------------------------------------------------------------------- drafter
def reference_lookup(tokens: list[int], lo: int, hi: int, k: int) -> tuple[list[int], int]:
    """Rescan: the longest suffix (n from hi down to lo) with an earlier occurrence; the k tokens after
    its latest one, in the sequence continued by the draft itself (a repeat goes on), and how many tokens
    before that occurrence equal those before the end (at most MATCH_CAP)."""
    L = len(tokens)
    for n in range(min(hi, L - 1), lo - 1, -1):
        for e in range(L - 1, n - 1, -1):
            if tokens[e - n:e] == tokens[L - n:]:
                ext = list(tokens)
                for i in range(k):
                    ext.append(ext[e + i])
                m = max(j for j in range(min(e, MATCH_CAP) + 1) if tokens[e - j:e] == tokens[L - j:])
                return ext[L:], m
    return [], 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=80), st.integers(1, 3), st.integers(0, 3),
       st.integers(1, 6), st.lists(st.integers(1, 7), min_size=1, max_size=30))
def test_index_matches_a_rescan_as_the_sequence_grows(seq, lo, extra, k, chunks):
    """Grown in random chunks (incremental indexing), every lookup equals the rescan's proposal: the
    tokens that followed the latest earlier occurrence of the longest matching suffix."""
    hi = lo + extra
    idx = NgramIndex(lo, hi)
    L, c = 0, 0
    while L < len(seq):
        L = min(len(seq), L + chunks[c % len(chunks)])
        c += 1
        idx.tokens = seq[:L]
        got, m = idx.lookup(k)
        assert (got, m) == reference_lookup(seq[:L], lo, hi, k)
        assert len(got) == (k if m else 0)  # whole (k tokens, continued periodically), empty without a match


def sreq(prompt, out=(), **sp) -> Req:
    params = SamplingParams.from_dict({"max_new_tokens": 32, "temperature": 0, **sp})
    return Req(rid="x", input_ids=list(prompt), sampling=params, output_ids=list(out))


def test_drafter_bounds_and_refusals():
    d = NgramDrafter(NgramConfig(num_draft_tokens=6, min_match=1, max_match=3), (EOS,), context_len=64)
    cyc = [1, 2, 3, 4, 5, 6, 7, 8] * 3
    assert d.draft(sreq(cyc)) == [1, 2, 3, 4, 5, 6]  # k tokens after the latest earlier "6 7 8"
    assert d.draft(sreq(cyc, max_new_tokens=4)) == [1, 2, 3]  # room for the model's own token
    assert d.draft(sreq(cyc, max_new_tokens=1)) == []
    assert d.draft(sreq([1, 2, EOS, 3] * 4 + [1, 2])) == []  # the finish id is never drafted
    assert d.draft(sreq([1, 2, EOS, 3] * 4 + [1, 2], ignore_eos=True)) == [EOS, 3, 1, 2, EOS, 3]  # the repeat goes on
    assert d.draft(sreq([1, 2, 9, 3] * 4 + [1, 2], stop_token_ids=[3])) == [9]
    # positions stay inside the context (64): 62 tokens leave room for 64 - 62 - 1 = 1 draft token
    assert d.draft(sreq(list(range(60)) + [0, 1])) == [2]
    for sp in ({"frequency_penalty": 0.5}, {"sampling_seed": 3}, {"min_new_tokens": 4}):
        assert d.draft(sreq(cyc, **sp)) == [], sp  # rows would see stale penalties / seeds / EOS masks
    r = sreq(cyc)
    r.grammar = object()  # constrained: the grammar's jump-forward is its only draft source
    assert d.draft(r) == []


def test_draft_length_follows_the_match():
    """At most PER_MATCH tokens per matched token (the match measured past the window), up to k; the values
    handed to trim_to_cost are the agreement model's, and verifications teach it."""
    d = NgramDrafter(NgramConfig(8, 1, 2), (EOS,), 4096)
    r = sreq([7, 1, 2, 3, 4, 5, 6, 9, 1])  # "1" matched over one token: two tokens proposed
    assert d.draft(r) == [2, 3] and r.spec_match == 1
    r = sreq([7, 1, 2, 3, 4, 5, 6, 9, 1, 2, 3])  # "1 2 3" matched over three (window 2): six tokens
    assert d.draft(r) == [4, 5, 6, 9, 1, 2] and r.spec_match == 3
    r = sreq([1, 2, 3] * 10)
    assert len(d.draft(r)) == 8 and r.spec_match == 27  # long match: k
    assert r.spec_values == d.agree.values(27, 8)
    assert all(a >= b for a, b in zip(r.spec_values, r.spec_values[1:]))
    before = d.agree.p(27)
    d.update(r, 8, 2)  # rows 0, 1 taken (matches 27, 28), row 2 refused (29): bucket [24, 32) learns 2 of 3
    assert (r.spec_draft_tokens, r.spec_accepted_tokens) == (8, 2)
    assert d.agree.p(27) < before and d.agree.p(5) == d.agree.values(5, 1)[0]


def test_accept_stats_merge_over_replicas():
    """Data parallel: the replicas' histograms summed, the mean recomputed; replicas without a drafter skipped."""
    from radixlang_runtime.speculative.accept_stats import AcceptStats, merge_accept_stats

    a, b = AcceptStats(), AcceptStats()
    for x in (0, 2, 2):
        a.add(x)
    for x in (2, 5):
        b.add(x)
    got = merge_accept_stats([a.to_dict(), None, b.to_dict()])
    assert got == {"verifications": 5, "mean_accept_length": 1 + 11 / 5, "histogram": {"0": 1, "2": 3, "5": 1}}
    assert merge_accept_stats([None, None]) is None


def test_match_agreement_prior_and_learning():
    """Before any verification: the rule of succession, (m + 1) / (m + 2); taken rows raise their bucket, a
    refused row lowers it, rows after the refusal are not evidence; old evidence decays."""
    a = MatchAgreement()
    assert [round(a.p(m), 6) for m in (1, 2, 7)] == [round(2 / 3, 6), 0.75, round(8 / 9, 6)]
    assert a.values(1, 3) == pytest.approx([2 / 3, 2 / 3 * 3 / 4, 2 / 3 * 3 / 4 * 4 / 5])
    a.observe(1, drafted=4, accepted=0)  # row 0 (match 1) refused; rows 1-3 unseen
    assert a.p(1) < 2 / 3 and a.p(2) == 0.75 and a.p(3) == pytest.approx(0.8)
    for _ in range(200):
        a.observe(2, drafted=1, accepted=1)
    assert a.p(2) > 0.97
    for _ in range(400):
        a.observe(2, drafted=1, accepted=0)
    assert a.p(2) < 0.03  # the first 200 decayed away


def with_values(r: Req, a: float) -> Req:
    """r's draft rows valued as if each were taken with probability a (trim_to_cost reads r.spec_values)."""
    r.spec_values = [a ** (j + 1) for j in range(len(r.draft))]
    return r


def _rate(reqs, c, alphas):
    """Expected tokens per unit of step cost under trim_to_cost's model (1 + c * rows), acceptance alphas."""
    tokens = len(reqs) + sum(a ** (j + 1) for r, a in zip(reqs, alphas) for j in range(len(r.draft)))
    return tokens / (1 + c * (len(reqs) + sum(len(r.draft) for r in reqs)))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=70),
       st.sampled_from([0.05, ROW_COST, 0.5]))
def test_trim_to_cost_never_lowers_the_expected_rate(spec, c):
    """Each request keeps a prefix of its draft; the kept rows' expected rate is >= no drafts at all, and no
    single further row (the next one of any request) would raise it."""
    reqs = []
    for k, hits, misses in spec:
        r = sreq([1, 2, 3])
        r.draft = list(range(k))
        reqs.append(with_values(r, (hits + 1) / (hits + misses + 2)))
    full = [list(r.draft) for r in reqs]
    alphas = [r.spec_values[0] if r.spec_values else 0.0 for r in reqs]
    trim_to_cost(reqs, c)
    for r, f in zip(reqs, full):
        assert r.draft == f[:len(r.draft)]
    bare = [sreq([1, 2, 3]) for _ in reqs]
    assert _rate(reqs, c, alphas) >= _rate(bare, c, alphas) - 1e-12
    for r, f in zip(reqs, full):
        if len(r.draft) < len(f):
            kept = r.draft
            r.draft = f[:len(kept) + 1]
            grown = _rate(reqs, c, alphas)
            r.draft = kept
            assert grown <= _rate(reqs, c, alphas) + 1e-12


def test_trim_to_cost_steps_aside_at_large_batches():
    """A coin-flip draft (acceptance 0.5) is worth rows for a lone request, not in a batch of 64; a draft
    the model always takes keeps its first row even there."""
    def batch(n, hits, misses):
        reqs = [sreq([1, 2, 3]) for _ in range(n)]
        for r in reqs:
            r.draft = [5, 6, 7, 8]
            with_values(r, (hits + 1) / (hits + misses + 2))
        return reqs
    one = batch(1, 0, 0)
    trim_to_cost(one, ROW_COST)
    assert len(one[0].draft) >= 2
    many = batch(64, 0, 0)
    trim_to_cost(many, ROW_COST)
    assert all(r.draft == [] for r in many)
    sure = batch(64, 40, 0)
    trim_to_cost(sure, ROW_COST)
    assert all(len(r.draft) >= 1 for r in sure)
    mid = batch(4, 0, 1)  # one rejection: acceptance 1/3, just under batch 4's break-even (0.342)
    trim_to_cost(mid, ROW_COST)
    assert all(r.draft == [] for r in mid)
    even = batch(4, 1, 1)  # a coin flip: just over batch 4's break-even, one row each
    trim_to_cost(even, ROW_COST)
    assert all(len(r.draft) == 1 for r in even)


def test_flags_refused_by_name():
    with pytest.raises(ValueError, match="EAGLE3"):  # separate EAGLE-3 draft heads: not implemented
        ServerArgs(speculative_algorithm="EAGLE3")
    with pytest.raises(ValueError, match="speculative_num_draft_tokens"):
        ServerArgs(speculative_num_draft_tokens=4)  # without NGRAM it would be ignored
    with pytest.raises(ValueError, match="min_match_window_size"):
        ServerArgs(speculative_algorithm="NGRAM", speculative_ngram_min_match_window_size=5,
                   speculative_ngram_max_match_window_size=3)
    # verification rows are rows like any in the deterministic mode (speculative/test_spec_identical.py);
    # STANDALONE with it stays refused (speculative/test_spec_standalone.py)
    assert ServerArgs(speculative_algorithm="NGRAM", enable_deterministic_inference=True).enable_deterministic_inference
    with pytest.raises(ValueError, match="speculative_eagle_topk set with speculative_algorithm NGRAM"):
        ServerArgs(speculative_algorithm="NGRAM", speculative_eagle_topk=4)
    assert ServerArgs(speculative_algorithm="NGRAM").speculative_ngram_settings() == (16, 1, 6, 0)


# ---------------------------------------------------------------------------------------------- real model
COPY = ("Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, "
        "mango, nectarine.\nList: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, "
        "mango, nectarine.\nList again:")
PROMPTS = [COPY, "The capital of France is", "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
           "Write a short poem about the sea."]


@pytest.fixture(scope="module")
def spec_engine():
    yield from running_engine(dtype="float32", max_total_tokens=8192, debug_check_integrity=True,
                              speculative_algorithm="NGRAM", speculative_disable_by_batch_size=0)


def test_engine_greedy_identical_with_ngram(engine, spec_engine):
    from conftest import assert_whole as engine_whole

    sp = {"temperature": 0, "max_new_tokens": 40}
    off = engine.generate(PROMPTS, sp)
    on = spec_engine.generate(PROMPTS, sp)
    for a, b in zip(off, on):
        assert b["output_ids"] == a["output_ids"]
        assert b["text"] == a["text"]
    assert on[0]["meta_info"]["spec_accepted_tokens"] > 0  # speculation ran and the model agreed
    assert on[0]["meta_info"]["forward_passes"] < len(on[0]["output_ids"])
    stats = spec_engine.get_stats()
    assert stats["spec_accepted_tokens"] >= on[0]["meta_info"]["spec_accepted_tokens"]
    assert stats["spec_draft_tokens"] >= stats["spec_accepted_tokens"]
    assert sum(v["weight"] for v in stats["spec_step_cost"].values()) > 0  # the cost rule measured its steps
    engine_whole(spec_engine)


def test_engine_stop_strings_and_logprobs_identical(engine, spec_engine):
    from conftest import assert_whole as engine_whole

    sp = {"temperature": 0, "max_new_tokens": 48, "stop": ["kiwi"]}
    kw = {"return_logprob": True, "top_logprobs_num": 3}
    a = engine.generate(COPY, sp, **kw)
    b = spec_engine.generate(COPY, sp, **kw)
    assert b["text"] == a["text"] and b["output_ids"] == a["output_ids"]
    assert b["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
    assert b["meta_info"]["spec_accepted_tokens"] > 0
    la, lb = a["meta_info"]["output_token_logprobs"], b["meta_info"]["output_token_logprobs"]
    assert len(la) == len(lb) == len(a["output_ids"])
    for (va, ta, _), (vb, tb, _) in zip(la, lb):
        assert tb == ta and vb is not None and vb == pytest.approx(va, abs=1e-3)
    ta_, tb_ = a["meta_info"]["output_top_logprobs"], b["meta_info"]["output_top_logprobs"]
    for ra, rb in zip(ta_, tb_):
        assert [t for _, t, _ in rb] == [t for _, t, _ in ra]
    engine_whole(spec_engine)


@pytest.fixture(scope="module")
def ngram_server():
    from server_utils import ServerProcess

    srv = ServerProcess("--dtype", "float32", "--max-total-tokens", "4096", "--enable-metrics",
                        "--debug-check-integrity", "--speculative-algorithm", "NGRAM",
                        "--speculative-num-draft-tokens", "6", "--speculative-ngram-max-match-window-size", "3")
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


def test_server_flags_meta_info_metrics_and_the_live_view(ngram_server):
    """The CLI flags through a real server: meta_info, /metrics (the counters and the accept-length histogram)
    and the live view's state carry the same verifications."""
    import httpx

    with httpx.Client(base_url=ngram_server.url, timeout=120) as c:
        r = c.post("/generate", json={"text": COPY, "sampling_params": {"temperature": 0, "max_new_tokens": 24}})
        assert r.status_code == 200, r.text
        meta = r.json()["meta_info"]
        assert meta["spec_accepted_tokens"] > 0 and meta["spec_draft_tokens"] >= meta["spec_accepted_tokens"]
        lines = c.get("/metrics").text.splitlines()
        line = next(x for x in lines if x.startswith("radixlang:spec_accepted_tokens "))
        assert float(line.split()[1]) >= meta["spec_accepted_tokens"]
        hist = {x.split('"')[1]: float(x.split()[1]) for x in lines if x.startswith("radixlang:spec_verifications{")}
        info = c.get("/server_info").json()
        assert info["speculative_algorithm"] == "NGRAM" and info["speculative_num_draft_tokens"] == 6
        spec = c.get("/dashboard/state").json()["spec"]
    assert spec["algorithm"] == "NGRAM" and spec["accepted_tokens"] == meta["spec_accepted_tokens"]
    al = spec["accept_length"]
    assert sum(int(k) * n for k, n in al["histogram"].items()) == spec["accepted_tokens"]  # one entry a verification
    assert hist == {k: float(n) for k, n in al["histogram"].items()} and al["verifications"] == sum(hist.values())
    assert al["mean_accept_length"] == pytest.approx(1 + spec["accepted_tokens"] / al["verifications"])


@pytest.mark.skipif(chromium() is None, reason="no Chromium installed (apt install chromium)")
def test_live_view_draws_the_accept_length_histogram(ngram_server):
    import time

    import httpx

    from radixlang_runtime.server.dashboard import STATE_TTL_S

    r = httpx.post(ngram_server.url + "/generate", timeout=120,
                   json={"text": COPY, "sampling_params": {"temperature": 0, "max_new_tokens": 24}})
    assert r.status_code == 200, r.text
    time.sleep(2 * STATE_TTL_S)  # past the state answer an earlier poll left shared
    spec = httpx.get(ngram_server.url + "/dashboard/state", timeout=60).json()["spec"]
    dom = browser("--dump-dom", ngram_server.url + "/dashboard")
    assert 'data-loaded="1"' in dom, dom[-3000:]
    assert f'id="spec-accepted">{spec["accepted_tokens"]}<' in dom and "(NGRAM)" in dom
    for k, n in spec["accept_length"]["histogram"].items():
        assert f'data-accepted="{k}" data-count="{n}"' in dom


def test_point_mass_draft_keeps_the_sampling_distribution():
    """sample_step on a point-mass draft d at temperature 1: the first emitted token is distributed as p0
    (accepted d with P = p0(d), else a sample != d), and after an accepted d the next one as p1."""
    import torch

    from radixlang_runtime.model.executor.sample_step import sample_step
    from radixlang_runtime.model.executor.sampler import Sampler
    from radixlang_runtime.model.executor.step_io import ModelBatch, SampleSpec, StepResult

    n, V, d = 6000, 5, 2
    p0 = torch.tensor([0.1, 0.2, 0.4, 0.2, 0.1])
    p1 = torch.tensor([0.5, 0.1, 0.1, 0.2, 0.1])
    sp = SamplingParams.from_dict({"temperature": 1.0, "max_new_tokens": 8})
    specs = [SampleSpec(sp, [0], [], draft=[d]) for _ in range(n)]
    batch = ModelBatch("mixed", [str(i) for i in range(n)], list(range(n)), [0] * n, [[0, d]] * n, [[0, 0]] * n,
                       [], specs, [None] * n)
    logits = torch.stack([p0.log(), p1.log()] * n)  # [2n, V]: rows 0 and 1 of each request
    result = StepResult()
    sample_step(batch, list(range(n)), [2] * n, logits, Sampler(V, [], torch.device("cpu"), seed=7), result)
    first = [d if result.accepted.get(i, 0) else result.next_token_ids[i] for i in range(n)]
    after = [result.next_token_ids[i] for i in range(n) if result.accepted.get(i, 0)]
    freq0 = torch.bincount(torch.tensor(first), minlength=V).float() / n
    freq1 = torch.bincount(torch.tensor(after), minlength=V).float() / len(after)
    assert torch.allclose(freq0, p0, atol=0.03), freq0  # ~5 standard deviations at n = 6000
    assert torch.allclose(freq1, p1, atol=0.05), freq1  # ~2,400 accepted


@pytest.mark.parametrize("page_size", [1, 2])
def test_radix_continuation(page_size):
    """RadixCache.continuation: what the tree holds after a path (whole or inside an edge, partial pages too),
    the most recently used branch first; [] off the tree."""
    tree = RadixCache(page_size)
    tree.insert([1, 2, 3, 4, 5, 6, 7, 8], list(range(8)))
    tree.insert([1, 2, 3, 4, 9, 9, 9, 9], list(range(8, 16)))  # newer: its branch wins after [1, 2, 3, 4]
    assert tree.continuation([1, 2, 3], 3) == [4, 9, 9]
    assert tree.continuation([1, 2, 3, 4, 5], 2) == [6, 7]
    assert tree.continuation([1, 2, 3, 4, 5, 6, 7, 8], 2) == []  # nothing cached after it
    assert tree.continuation([1, 2, 7], 2) == [] and tree.continuation([5], 2) == []
    assert tree.continuation([], 2) == [1, 2]


def test_engine_drafts_from_the_radix_corpus(engine, spec_engine):
    """A request that repeats what a cached one said gets drafts from the radix tree (its own text has few
    n-gram matches), the model accepts them, and the greedy output is the one without speculation."""
    prompt = "Describe a quiet morning in a small mountain village, with its bakery and church bells."
    sp = {"temperature": 0, "max_new_tokens": 24}
    first = spec_engine.generate(prompt, sp)
    drafter = spec_engine.scheduler.drafts.drafter
    before = drafter.corpus_accepted
    again = spec_engine.generate(prompt, sp)
    assert drafter.corpus_accepted > before
    assert again["output_ids"] == first["output_ids"] == engine.generate(prompt, sp)["output_ids"]
