"""StepGuard: a grammar's per-token work (masks, matcher moves, forced strings) on a thread of its own, with a
deadline. Torch-free.

The scheduler thread asks a grammar for the allowed set of a state it has not seen (matcher_grammar.py,
grammar.py); on a cache miss the grammar hands the computation to StepGuard.run, which runs it on the
guard's executor thread and waits at most the step timeout (--grammar-step-timeout). The time waited is
charged to the request; once its total passes --grammar-request-timeout the request fails (the call
that crossed it completed, so the grammar stays usable for other requests). The native libraries
drop the GIL in their heavy calls (xgrammar's accept_token / fill_next_token_bitmask, llguidance's
consume_token / fill_next_token_bitmask; outlines-core's index lookups are precomputed), so a slow call
does not stop the scheduler thread while it waits.

Past the deadline the call is abandoned: its thread is left to finish on its own (a native call cannot
be interrupted) and a fresh executor thread takes the next calls; the grammar object it was working on
is marked broken (its matcher may be mid-call) and its requests fail with GrammarBudgetExceeded naming
the limit; on_broken lets the compiler drop it from its cache and remember the error (a later request
with the same grammar gets the error at once). The request whose budget ran out fails alone.

Budgets: one GrammarBudget per request (GrammarState.budget, shared by its copies); the grammar state
names the budget to charge before it calls its grammar (charge()), a thread-local read by run().
Invariants: the scheduler thread never waits on a grammar call longer than the step timeout; a grammar
marked broken is never called again; at most one call runs on the live executor at a time.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional


class GrammarBudgetExceeded(RuntimeError):
    """A grammar step or a request's total grammar time went past its limit (the message names it)."""


@dataclass
class GrammarBudget:
    total_s: float  # the request's grammar time (--grammar-request-timeout)
    spent_s: float = 0.0
    error: Optional[str] = None  # set once the budget is exceeded: every later call raises it


@dataclass(frozen=True)
class StepLimits:
    step_timeout_s: float = 1.0  # one grammar call (one mask, one forced string)
    request_timeout_s: float = 30.0  # all of one request's grammar calls

    def __post_init__(self) -> None:
        assert self.step_timeout_s > 0 and self.request_timeout_s > 0


_local = threading.local()


def charge(budget: Optional[GrammarBudget]) -> None:
    """The budget the next grammar calls of this thread are charged to (GrammarState does it per call)."""
    _local.budget = budget


class _Call:
    __slots__ = ("fn", "args", "done", "result", "error")

    def __init__(self, fn: Callable[..., Any], args: tuple):
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.result: Any = None
        self.error: Optional[BaseException] = None


class _Executor:
    def __init__(self, name: str):
        self.jobs: queue.SimpleQueue[Optional[_Call]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            call = self.jobs.get()
            if call is None:
                return
            try:
                call.result = call.fn(*call.args)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                call.error = e
            call.done.set()


class StepGuard:
    def __init__(self, limits: StepLimits = StepLimits(),
                 on_broken: Optional[Callable[[Any, str], None]] = None):
        self.limits = limits
        self.on_broken = on_broken
        self._executor: Optional[_Executor] = None
        self.abandoned = 0  # calls left running past their deadline (their threads end on their own)
        self.calls = 0

    def new_budget(self) -> GrammarBudget:
        return GrammarBudget(self.limits.request_timeout_s)

    def run(self, grammar: Any, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the executor thread within the deadline; GrammarBudgetExceeded past it."""
        if grammar.broken:
            raise GrammarBudgetExceeded(grammar.broken)
        budget: Optional[GrammarBudget] = getattr(_local, "budget", None)
        if budget is not None and budget.error:
            raise GrammarBudgetExceeded(budget.error)
        step = self.limits.step_timeout_s
        if self._executor is None:
            self._executor = _Executor("grammar-step")
        call = _Call(fn, args)
        self.calls += 1
        t0 = time.monotonic()
        self._executor.jobs.put(call)
        finished = call.done.wait(step)
        if budget is not None:
            budget.spent_s += time.monotonic() - t0
        if not finished:
            self._abandon()
            msg = f"grammar step exceeded --grammar-step-timeout {step:g} s"
            grammar.broken = f"{msg} (the grammar was abandoned mid-step)"
            if budget is not None:
                budget.error = msg
            if self.on_broken is not None:
                self.on_broken(grammar, msg)
            raise GrammarBudgetExceeded(msg)
        if call.error is not None:
            raise call.error
        if budget is not None and budget.spent_s > budget.total_s:
            budget.error = (f"grammar exceeded --grammar-request-timeout {self.limits.request_timeout_s:g} s "
                            "of grammar time")
            raise GrammarBudgetExceeded(budget.error)
        return call.result

    def _abandon(self) -> None:
        """The executor's thread is stuck in a call: leave it (it exits after the call), start afresh."""
        old, self._executor = self._executor, None
        if old is not None:
            old.jobs.put(None)
        self.abandoned += 1

    def close(self) -> None:
        if self._executor is not None:
            self._executor.jobs.put(None)
            self._executor = None
