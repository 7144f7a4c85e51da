"""StepGuard (constrained/step_guard.py): grammar calls with a per-call deadline and a per-request budget; a call
past its deadline is abandoned (its grammar marked broken and reported), the caller gets an error naming the
flag, and the next grammar works on a fresh thread. With a real xgrammar matcher: a request's budget ends it
alone, a mask for such a row allows only EOS, and the grammar cache's weight counts the allowed sets."""

from __future__ import annotations

import threading
import time

import pytest
from test_constrained_helpers import EOS, encode, vocab

from radixlang_runtime.constrained.cache import GrammarCacheConfig, GrammarCompiler
from radixlang_runtime.constrained.grammar import compile_grammar
from radixlang_runtime.constrained.spec import GrammarSpec
from radixlang_runtime.constrained.state import GrammarState
from radixlang_runtime.constrained.step_guard import GrammarBudgetExceeded, StepGuard, StepLimits, charge


@pytest.fixture(autouse=True)
def no_budget_charged():
    """The thread-local budget the scheduler charges grammar calls to: none before and after each test (a test
    that drives a scheduler on this thread leaves its last request's)."""
    charge(None)
    yield
    charge(None)


class _Grammar:
    broken = None


def test_call_past_the_step_timeout_is_abandoned_and_named():
    reported = []
    guard = StepGuard(StepLimits(step_timeout_s=0.1, request_timeout_s=30), lambda g, m: reported.append((g, m)))
    g, other = _Grammar(), _Grammar()
    assert guard.run(g, lambda x: x + 1, 1) == 2
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(GrammarBudgetExceeded, match=r"--grammar-step-timeout 0.1 s"):
        guard.run(g, release.wait, 60)  # a call that would block for a minute
    assert time.monotonic() - t0 < 10  # generous: the caller waited about the step timeout, not the call
    assert g.broken and reported == [(g, "grammar step exceeded --grammar-step-timeout 0.1 s")]
    with pytest.raises(GrammarBudgetExceeded, match="abandoned"):
        guard.run(g, lambda: 1)  # a broken grammar is never called again
    assert guard.run(other, lambda: "fresh thread") == "fresh thread" and guard.abandoned == 1
    release.set()
    guard.close()


def test_request_budget_ends_only_that_request():
    guard = StepGuard(StepLimits(step_timeout_s=5, request_timeout_s=0.3))
    g = _Grammar()
    slow, fast = guard.new_budget(), guard.new_budget()
    charge(slow)
    with pytest.raises(GrammarBudgetExceeded, match=r"--grammar-request-timeout 0.3 s"):
        for _ in range(20):
            guard.run(g, time.sleep, 0.05)
    assert slow.error and g.broken is None  # the grammar is fine: only this request's budget is spent
    with pytest.raises(GrammarBudgetExceeded):
        guard.run(g, lambda: 1)  # still charged to the spent budget
    charge(fast)
    assert guard.run(g, lambda: 7) == 7
    charge(None)
    guard.close()


def test_xgrammar_request_over_budget_masks_eos_only_and_fails():
    from radixlang_runtime.constrained.mask import build_mask

    v = vocab()
    g = compile_grammar(GrammarSpec.from_ebnf('root ::= [a-z ]+ "."'), v, "xgrammar")
    g.guard = StepGuard(StepLimits(step_timeout_s=5, request_timeout_s=30))
    ok = GrammarState(g, [EOS], budget=g.guard.new_budget())
    spent = GrammarState(g, [EOS], budget=g.guard.new_budget())
    spent.budget.error = "grammar exceeded --grammar-request-timeout 30 s of grammar time"
    for t in encode("hello"):
        assert ok.advance(t)
    row_ok, row_spent = build_mask([ok, spent], v.logits_width, "cpu")
    assert int(row_ok.sum()) > 10
    assert row_spent.nonzero().flatten().tolist() == [EOS]  # softmax sees one finite entry: the request ends
    with pytest.raises(GrammarBudgetExceeded, match="request-timeout"):
        spent.advance(encode("h")[0])  # the scheduler's next grammar step ends the request
    g.guard.close()


def test_grammar_cache_weighs_allowed_sets_and_flush_releases():
    v = vocab()
    comp = GrammarCompiler(v, GrammarCacheConfig(num_workers=1, backend="xgrammar", cache_bytes=1 << 30))
    try:
        h = comp.submit(GrammarSpec.from_ebnf('root ::= [a-z ]+ "!"'))
        assert h.wait(120) == "ready", h.error
        before = comp.cached_bytes
        st = GrammarState(h.grammar, [EOS], budget=comp.guard.new_budget())
        for t in encode("hello world"):
            st.allowed()
            assert st.advance(t)
        assert comp.cached_bytes > before + 4 * v.logits_width  # each visited state's allowed set is counted
        assert h.grammar.guard is comp.guard
        comp.clear()
        assert comp.cached_bytes == 0 and comp.get(h.spec) is None
    finally:
        comp.close()
