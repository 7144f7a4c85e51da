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

Asynchronous form (what keeps grammar work off the scheduler's critical path, mask_prefetch.py): submit()
queues a call and returns at once; wait() waits for it at most a given time; settle() charges it and hands
its result (or its error) over. The step timeout runs from the moment the executor starts a call, so calls
queued behind a slow one are not charged for the queue; whoever waits (or polls, expire()) past a running
call's deadline abandons it, and the calls queued behind it move to the fresh executor thread.

Budgets: one GrammarBudget per request (GrammarState.budget, shared by its copies); the grammar state
names the budget to charge before it calls its grammar (charge()), a thread-local read by run(); submit()
takes it explicitly. A call is charged its running time (start to end, or to its abandonment), once.
Invariants: the scheduler thread never waits on one running grammar call longer than the step timeout; a
grammar marked broken is never called again; at most one call runs on the live executor at a time, and an
abandoned executor starts no call after the one it is stuck in.
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


class GrammarCall:
    """One grammar call handed to the executor: its result once `done`, or its error (an abandoned call:
    GrammarBudgetExceeded naming the step timeout)."""

    __slots__ = ("grammar", "fn", "args", "budget", "done", "result", "error", "claimed", "started_at",
                 "ended_at", "abandoned", "charged")

    def __init__(self, grammar: Any, fn: Callable[..., Any], args: tuple, budget: Optional[GrammarBudget]):
        self.grammar, self.fn, self.args, self.budget = grammar, fn, args, budget
        self.done = threading.Event()  # set by the executor when the call returned (also after an abandonment)
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.claimed = False  # an executor started it (guarded by that executor's lock)
        self.started_at = 0.0
        self.ended_at = 0.0
        self.abandoned: Optional[str] = None  # the step-timeout message once abandoned
        self.charged = False

    @property
    def finished(self) -> bool:
        """Its outcome is known: returned, raised, or abandoned."""
        return self.abandoned is not None or self.done.is_set()


class _Executor:
    def __init__(self, name: str):
        self.jobs: queue.SimpleQueue[Optional[GrammarCall]] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.current: Optional[GrammarCall] = None
        self.retired = False  # abandoned: starts nothing after the call it is stuck in
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            call = self.jobs.get()
            if call is None:
                return
            with self.lock:
                if self.retired:
                    return
                if call.claimed:
                    continue
                call.claimed, call.started_at, self.current = True, time.monotonic(), call
            try:
                call.result = call.fn(*call.args)
            except BaseException as e:  # noqa: BLE001 - handed to whoever settles the call
                call.error = e
            call.ended_at = time.monotonic()
            with self.lock:
                self.current = None
            call.done.set()


class StepGuard:
    def __init__(self, limits: StepLimits = StepLimits(),
                 on_broken: Optional[Callable[[Any, str], None]] = None):
        self.limits = limits
        self.on_broken = on_broken
        self._executor: Optional[_Executor] = None
        self._open: list[GrammarCall] = []  # submitted, not yet started (moved to a fresh executor on abandon)
        self._lock = threading.Lock()  # _executor and _open (submit may come from any thread)
        self.abandoned = 0  # calls left running past their deadline (their threads end on their own)
        self.calls = 0

    def new_budget(self) -> GrammarBudget:
        return GrammarBudget(self.limits.request_timeout_s)

    # ------------------------------------------------------------------ asynchronous form
    def submit(self, grammar: Any, fn: Callable[..., Any], *args: Any,
               budget: Optional[GrammarBudget] = None) -> GrammarCall:
        """Queue fn(*args) on the executor thread; returns at once. GrammarBudgetExceeded when the grammar is
        broken or the budget spent already (nothing is queued then)."""
        if grammar.broken:
            raise GrammarBudgetExceeded(grammar.broken)
        if budget is not None and budget.error:
            raise GrammarBudgetExceeded(budget.error)
        call = GrammarCall(grammar, fn, args, budget)
        with self._lock:
            if self._executor is None or self._executor.retired:
                self._executor = _Executor("grammar-step")
            self._open = [c for c in self._open if not c.claimed]
            self._open.append(call)
            self.calls += 1
            self._executor.jobs.put(call)
        return call

    def wait(self, call: GrammarCall, timeout: float) -> bool:
        """Wait up to `timeout` s for call's outcome (True: known; settle() hands it over). A running call
        past the step timeout is abandoned meanwhile (this one or the one ahead of it)."""
        end = time.monotonic() + max(0.0, timeout)
        while True:
            if call.finished:
                return True
            deadline = self.expire()  # when the running call's step timeout ends (None: nothing running)
            if call.finished:
                return True
            now = time.monotonic()
            if now >= end:
                return False
            until = end if deadline is None else min(end, deadline + 0.001)
            call.done.wait(max(0.0, min(until - now, self.limits.step_timeout_s)))

    def expire(self) -> Optional[float]:
        """Abandon the running call if past its step timeout; -> the running call's deadline (monotonic), or
        None when no call runs."""
        ex = self._executor
        if ex is None:
            return None
        step = self.limits.step_timeout_s
        with ex.lock:
            cur = ex.current
            if cur is None or cur.done.is_set():
                return None
            deadline = cur.started_at + step
            if time.monotonic() < deadline:
                return deadline
            ex.retired = True  # it starts nothing more: the calls queued behind move to a fresh thread
        self._abandon(ex, cur)
        return None

    def settle(self, call: GrammarCall) -> Any:
        """A finished call's result, charged to its budget (once); raises its error, or GrammarBudgetExceeded
        when it was abandoned or its request's total went past --grammar-request-timeout."""
        assert call.finished
        budget = call.budget
        if budget is not None and not call.charged:
            call.charged = True
            if call.claimed:
                budget.spent_s += (call.ended_at or time.monotonic()) - call.started_at
        if call.abandoned is not None:
            raise GrammarBudgetExceeded(call.abandoned)
        if call.error is not None:
            raise call.error
        if budget is not None and budget.spent_s > budget.total_s:
            budget.error = budget.error or (f"grammar exceeded --grammar-request-timeout "
                                            f"{self.limits.request_timeout_s:g} s of grammar time")
            raise GrammarBudgetExceeded(budget.error)
        return call.result

    # ------------------------------------------------------------------ blocking form
    def run(self, grammar: Any, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the executor thread within the deadline; GrammarBudgetExceeded past it."""
        budget: Optional[GrammarBudget] = getattr(_local, "budget", None)
        call = self.submit(grammar, fn, *args, budget=budget)
        self.wait_out(call)
        return self.settle(call)

    def wait_out(self, call: GrammarCall) -> None:
        """Wait for call's outcome as long as the calls ahead of it may take; a call that has not finished by
        then (its thread starved of CPU) is abandoned like a call past its step timeout."""
        if self.wait(call, self.full_wait_s()):
            return
        with self._lock:
            ex = self._executor
        if ex is not None:
            with ex.lock:
                if call.finished:
                    return
                ex.retired = True
        self._abandon(ex, call)

    def full_wait_s(self) -> float:
        """Long enough for a call submitted now: every call ahead of it runs at most the step timeout before
        it is abandoned."""
        return self.limits.step_timeout_s * (len(self._open) + 2) + 1.0

    def _abandon(self, ex: Optional[_Executor], call: GrammarCall) -> None:
        """ex's thread is stuck in `call`: leave it (it exits after the call), start afresh, fail the call."""
        step = self.limits.step_timeout_s
        msg = f"grammar step exceeded --grammar-step-timeout {step:g} s"
        call.ended_at = time.monotonic()
        call.grammar.broken = f"{msg} (the grammar was abandoned mid-step)"
        if call.budget is not None:
            call.budget.error = msg
        call.abandoned = msg
        with self._lock:
            if self._executor is ex:
                self._executor = None
            if ex is not None:
                ex.jobs.put(None)
            self.abandoned += 1
            queued = [c for c in self._open if not c.claimed and c is not call]
            self._open = []
        for c in queued:  # re-queued in order on the fresh thread (a broken grammar's calls fail at once)
            if c.grammar.broken:
                c.abandoned = c.grammar.broken
                continue
            with self._lock:
                if self._executor is None:
                    self._executor = _Executor("grammar-step")
                self._open.append(c)
                self._executor.jobs.put(c)
        if self.on_broken is not None:
            self.on_broken(call.grammar, msg)

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.jobs.put(None)
                self._executor = None
