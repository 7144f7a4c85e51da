"""Speculation is exact on the real model: 64 greedy requests (copy-heavy and free, stop strings, a
regex-constrained share, logprobs) give the same tokens with NGRAM speculation as without it — in float32, and
in the deterministic mode (float32, batch-invariant numerics) on a pool tight enough that decode retracts."""

from __future__ import annotations

import pytest

from conftest import PROMPTS, assert_whole, running_engine
from radixlang_kernels.cpu_caps import detect

ITEMS = ["apple", "banana", "cherry", "date", "fig", "grape", "kiwi", "lemon", "mango", "olive", "pear", "plum"]
CODE = "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
REGEX = r"(yes|no), because [a-z ]{3,24}\."


def requests() -> list[tuple[str, dict]]:
    """64 (prompt, sampling params): 24 copy-heavy (repeat a list, rewrite code, quote), 24 free, 8 with a
    stop string inside what they copy, 8 constrained by a regex (jump-forward's drafts, never n-gram ones)."""
    out = []
    for i in range(24):
        items = ", ".join(ITEMS[i % 5:] + ITEMS[:i % 5])
        kind = i % 3
        if kind == 0:
            p = f"Repeat this list exactly: {items}.\nList: {items}.\nList again:"
        elif kind == 1:
            p = f"Copy this code exactly ({i}):\n{CODE}\nCopy:\n"
        else:
            p = f"Passage: The {ITEMS[i % 12]} tree grows in the valley and gives fruit in May.\nQuote it exactly:"
        out.append((p, {"max_new_tokens": 20 + i % 9}))
    for i in range(24):
        out.append((PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)), {"max_new_tokens": 12 + i % 7}))
    for i in range(8):
        items = ", ".join(ITEMS[i:] + ITEMS[:i])
        out.append((f"Repeat this list exactly: {items}.\nList: {items}.\nList again:",
                    {"max_new_tokens": 32, "stop": [ITEMS[(i + 6) % 12]]}))
    for i in range(8):
        out.append((f"Question {i}: is the {ITEMS[i]} a fruit? Answer:", {"max_new_tokens": 24, "regex": REGEX}))
    assert len(out) == 64
    return [(p, {"temperature": 0, **sp}) for p, sp in out]


def run(engine, reqs) -> list[dict]:
    return engine.generate([p for p, _ in reqs], [sp for _, sp in reqs], return_logprob=True, top_logprobs_num=2)


def assert_same(got: list[dict], want: list[dict], exact_logprobs: bool) -> None:
    """Same tokens, text and finish reasons; the same logprob wherever both arms have one (a token that
    jump-forward supplied has none, and whether a forced token came that way depends on the step it fell in)."""
    compared = 0
    for i, (b, a) in enumerate(zip(got, want)):
        assert b["output_ids"] == a["output_ids"], f"request {i}"
        assert b["text"] == a["text"] and b["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"], i
        la, lb = a["meta_info"]["output_token_logprobs"], b["meta_info"]["output_token_logprobs"]
        assert [t for _, t, _ in lb] == [t for _, t, _ in la]
        pairs = [(va, vb) for (va, _, _), (vb, _, _) in zip(la, lb) if va is not None and vb is not None]
        tol = 0.0 if exact_logprobs else 1e-4
        assert [vb for _, vb in pairs] == pytest.approx([va for va, _ in pairs], abs=tol, rel=0), f"request {i}"
        compared += len(pairs)
    assert compared > 0.8 * sum(len(a["output_ids"]) for a in want)  # most tokens' logprobs compared


@pytest.fixture(scope="module")
def spec_engine_64():
    yield from running_engine(dtype="float32", max_total_tokens=8192, debug_check_integrity=True,
                              speculative_algorithm="NGRAM")


def test_float32_identical_with_ngram(engine, spec_engine_64):
    reqs = requests()
    want = run(engine, reqs)
    got = run(spec_engine_64, reqs)
    assert_same(got, want, exact_logprobs=False)
    accepted = sum(o["meta_info"]["spec_accepted_tokens"] for o in got)
    assert accepted > 64  # drafts were verified and taken, not just proposed
    assert sum(o["meta_info"]["forward_passes"] < len(o["output_ids"]) for o in got[:24]) >= 12
    assert_whole(spec_engine_64)


@pytest.mark.skipif(detect().compiler is None, reason="the deterministic mode needs the C kernels")
def test_deterministic_mode_identical_with_ngram_on_a_tight_pool():
    """Both arms batch-invariant (float32); the NGRAM arm on a pool that makes decode retract, with small
    prefill chunks: a token's numerics depend on its row alone, so verification rows give what decoding does."""
    from radixlang_runtime import Engine

    reqs = requests()
    det = dict(dtype="float32", enable_deterministic_inference=True, debug_check_integrity=True)
    try:
        eng = Engine(max_total_tokens=8192, **det)
    except ValueError as e:  # a CPU whose float32 linears move with the batch (model/executor/deterministic.py's probe)
        if "is refused" in str(e):
            pytest.skip(f"the deterministic mode is refused on this CPU: {e}")
        raise
    try:
        want = run(eng, reqs)
        assert_whole(eng)
    finally:
        eng.shutdown()
    eng = Engine(max_total_tokens=384, chunked_prefill_size=64, max_prefill_tokens=64, new_token_ratio_init=0.05,
                 new_token_ratio_min=0.05, speculative_algorithm="NGRAM", **det)
    try:
        got = run(eng, reqs)
        assert eng.scheduler.num_retracted_total > 0, "the pool was meant to force retractions"
        assert sum(o["meta_info"]["spec_accepted_tokens"] for o in got) > 64
        assert_whole(eng)
    finally:
        eng.shutdown()
    assert_same(got, want, exact_logprobs=True)
