"""Mask prefetch: a grammar state's allowed set computed on the step guard's thread while the scheduler goes
on (the model's forward pass, other requests). Torch-free.

The scheduler hands over the state a constrained request stands at as soon as it is known (after its token
is sampled and its grammar advanced; at admission, the grammar's initial state): prefetch() submits the
allowed-set computation (StepGuard.submit) unless the grammar caches it or a call for it is under way
already. collect() waits for it at most a given time; once it finished the set enters the grammar's
allowed-set cache and the call is charged to the request's budget (StepGuard.settle: past the step or the
request limit GrammarBudgetExceeded, as a blocking call would raise). A grammar's own allowed() also takes
a call under way instead of computing the state again (take_prefetched), waiting for it under the step
timeout.

Invariants: one call per (grammar, state) under way (Grammar.pending_masks); a call's result enters the
cache on the scheduler thread only; a grammar without a guard computes inline (nothing to prefetch).
"""

from __future__ import annotations

from typing import Any, Optional

from radixlang_runtime.constrained.step_guard import GrammarBudgetExceeded, GrammarCall


def prefetch(st: Any) -> Optional[GrammarCall]:
    """Start computing GrammarState st's allowed set unless it is cached, under way or not needed (terminated,
    no guard). -> the call under way, or None when there is nothing to wait for."""
    g = st.grammar
    if st.terminated or g.guard is None or g.cached_allowed(st.state) is not None:
        return None
    call = g.pending_masks.get(st.state)
    if call is None:
        call = g.guard.submit(g, g.compute_allowed, st.state, budget=st.budget)
        g.pending_masks[st.state] = call
    return call


def collect(st: Any, timeout: float) -> bool:
    """True once st's allowed set is cached, waiting up to `timeout` s for its call (submitted here if none
    is under way). Raises GrammarBudgetExceeded when the call or the request went past its limits."""
    if st.budget is not None and st.budget.error:
        raise GrammarBudgetExceeded(st.budget.error)
    call = prefetch(st)
    if call is None:
        return True
    g = st.grammar
    if not g.guard.wait(call, timeout):
        return False
    _store(g, st.state, call)
    return True


def take_prefetched(grammar: Any, state: int) -> Optional[Any]:
    """The allowed set of a call under way for `state` (waited for under the step timeout), or None when none
    is (the caller computes it)."""
    call = grammar.pending_masks.get(state)
    if call is None:
        return None
    grammar.guard.wait_out(call)
    grammar.pending_masks.pop(state, None)
    return grammar.guard.settle(call)


def _store(grammar: Any, state: int, call: GrammarCall) -> None:
    grammar.pending_masks.pop(state, None)
    grammar.store_allowed(state, grammar.guard.settle(call))
