"""Grammar work off the scheduler's critical path (scheduler/mask_gate.py, constrained/mask_prefetch.py): a
constrained request whose next mask is still computing sits out decode steps while the other requests go on,
rejoins once it is ready with the output it would have had alone, and ends alone past the step timeout or its
grammar budget; the first mask at admission does not hold the scheduler either. The step guard moves calls
queued behind an abandoned one to a fresh thread. Fake runner, a grammar whose mask the test gates (no model,
no torch)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from fakes import expected_output
from scheduler_utils import assert_whole, drain, make, req

from radixlang_runtime.constrained.grammar import CompiledGrammar
from radixlang_runtime.constrained.spec import GrammarSpec
from radixlang_runtime.constrained.step_guard import GrammarBudgetExceeded, StepGuard, StepLimits, charge
from radixlang_runtime.scheduler.grammar_queue import GrammarQueue


@pytest.fixture(autouse=True)
def no_budget_charged():
    """The thread-local budget the scheduler charges grammar calls to: none before and after each test (a test
    that drives a scheduler on this thread leaves its last request's)."""
    charge(None)
    yield
    charge(None)

WIDTH, GRAMMAR_EOS = 200, 199  # the grammar's vocabulary: FakeRunner's tokens 0..96 are all allowed, never EOS


class GatedIndex:
    """An outlines-like index allowing every token but EOS, never final; the mask of a state >= gate_from waits
    for `gate` (or sleeps `delay` s)."""

    def __init__(self, gate_from: int = 1 << 30, delay: float = 0.0):
        self.gate_from, self.delay = gate_from, delay
        self.gate = threading.Event()
        self.masks = 0

    def get_initial_state(self) -> int:
        return 0

    def get_allowed_tokens(self, state: int) -> list[int]:
        self.masks += 1
        if state >= self.gate_from:
            assert self.gate.wait(60), "gate never opened"
        if self.delay:
            time.sleep(self.delay)
        return list(range(GRAMMAR_EOS))

    def get_next_state(self, state: int, token: int):
        return None if token >= WIDTH else state + 1

    @staticmethod
    def is_final_state(state: int) -> bool:
        return False


class _Handle:
    def __init__(self, grammar):
        self.grammar, self.error = grammar, None

    def poll(self) -> str:
        return "ready"


class FakeCompiler:
    """What GrammarQueue needs of a GrammarCompiler: submit -> a ready handle with the test's grammar."""

    def __init__(self, index: GatedIndex, limits: StepLimits):
        self.guard = StepGuard(limits)
        vocab = SimpleNamespace(logits_width=WIDTH, eos_token_id=GRAMMAR_EOS, sentinel_id=WIDTH)
        self.grammar = CompiledGrammar(GrammarSpec.from_regex("[a-z]+"), index, vocab)
        self.grammar.guard = self.guard

    def start(self) -> None: ...
    def clear(self) -> None: ...

    def submit(self, spec) -> _Handle:
        return _Handle(self.grammar)

    def close(self) -> None:
        self.guard.close()


def make_constrained(index: GatedIndex, step_s: float = 30.0, request_s: float = 60.0):
    sched, runner = make()
    comp = FakeCompiler(index, StepLimits(step_s, request_s))
    sched.grammar = GrammarQueue(lambda: comp, (GRAMMAR_EOS,), jump_forward=False)
    sched.masks.grammar = sched.drafts.grammar = sched.grammar
    return sched, comp


def constrained(rid: str, n: int):
    return req(rid, 6, n, regex="[a-z]+")


def step_until(sched, cond, timeout_s: float = 30.0):
    """Step until cond() holds, within a time bound (a step count would race the mask threads: an idle step
    takes microseconds)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        sched.step()
    raise AssertionError("condition never held")


def test_a_slow_mask_leaves_the_batch_and_rejoins_with_its_solo_output():
    index = GatedIndex(gate_from=3)
    sched, comp = make_constrained(index)
    slow, canary = constrained("slow", 8), req("canary", 6, 40)
    sched.add_request(slow)
    step_until(sched, lambda: len(slow.output_ids) == 3 and slow.mask_pending)  # its 4th mask waits on the gate
    sched.add_request(canary)
    step_until(sched, lambda: canary.finished)  # decodes all its tokens while the mask is stuck
    assert len(slow.output_ids) == 3 and slow.mask_pending and not slow.finished
    assert canary.output_ids == expected_output(canary.input_ids, 40)
    assert sched.masks.late >= 1
    index.gate.set()
    drain(sched)
    assert slow.finished_reason["type"] == "length"
    assert slow.output_ids == expected_output(slow.input_ids, 8)  # the tokens it would have had alone
    assert not slow.mask_pending
    assert_whole(sched)
    comp.close()


def test_a_mask_past_the_step_timeout_ends_its_request_alone():
    index = GatedIndex(gate_from=2)
    sched, comp = make_constrained(index, step_s=0.3)
    slow, canary = constrained("slow", 8), req("canary", 6, 30)
    sched.add_request(slow)
    sched.add_request(canary)
    t0 = time.monotonic()
    drain(sched)
    assert time.monotonic() - t0 < 30  # generous: about the step timeout, never the gate's minute
    assert slow.finished_reason["type"] == "abort"
    assert "--grammar-step-timeout 0.3 s" in slow.finished_reason["message"]
    assert len(slow.output_ids) == 2
    assert canary.output_ids == expected_output(canary.input_ids, 30)
    assert comp.grammar.broken and comp.guard.abandoned == 1
    assert_whole(sched)
    index.gate.set()
    comp.close()


def test_the_request_budget_ends_its_request_alone():
    index = GatedIndex(delay=0.05)
    sched, comp = make_constrained(index, step_s=5, request_s=0.3)
    slow, canary = constrained("slow", 200), req("canary", 6, 20)
    sched.add_request(slow)
    sched.add_request(canary)
    drain(sched, limit=1_000_000)  # steps that only wait for the mask are short: many of them under load
    assert slow.finished_reason["type"] == "abort"
    assert "--grammar-request-timeout 0.3 s" in slow.finished_reason["message"]
    assert len(slow.output_ids) < 200  # ended by its budget (how many tokens first depends on the machine)
    assert slow.output_ids == expected_output(slow.input_ids, len(slow.output_ids))
    assert canary.output_ids == expected_output(canary.input_ids, 20)
    assert comp.grammar.broken is None  # the grammar is fine: only that request's budget is spent
    assert_whole(sched)
    comp.close()


def test_the_first_mask_computes_while_others_decode():
    index = GatedIndex(gate_from=0)
    sched, comp = make_constrained(index)
    canary = req("canary", 6, 30)
    sched.add_request(canary)
    sched.step()  # the canary's prefill
    slow = constrained("slow", 5)
    sched.add_request(slow)
    step_until(sched, lambda: canary.finished)
    assert slow in sched.grammar.pending and not slow.output_ids  # its initial mask waits on the gate
    index.gate.set()
    drain(sched)
    assert slow.output_ids == expected_output(slow.input_ids, 5)
    assert_whole(sched)
    comp.close()


def test_an_abort_of_a_request_waiting_for_its_mask_frees_it():
    index = GatedIndex(gate_from=2)
    sched, comp = make_constrained(index)
    slow = constrained("slow", 8)
    sched.add_request(slow)
    step_until(sched, lambda: slow.mask_pending)
    sched.abort("slow")
    drain(sched)
    assert slow.finished_reason == {"type": "abort", "message": "aborted by request"}
    assert_whole(sched)
    index.gate.set()
    comp.close()


class _G:
    broken = None


def test_calls_queued_behind_an_abandoned_call_run_on_a_fresh_thread():
    guard = StepGuard(StepLimits(step_timeout_s=0.2, request_timeout_s=30))
    stuck, other = _G(), _G()
    gate = threading.Event()
    first = guard.submit(stuck, gate.wait, 60)
    queued = guard.submit(other, lambda: "ran", budget=guard.new_budget())
    assert guard.wait(queued, 20)  # waits out the stuck call's step timeout, then the queued call runs
    assert guard.settle(queued) == "ran" and queued.budget.spent_s < 0.2  # not charged for the queue
    assert first.finished and guard.abandoned == 1 and stuck.broken
    with pytest.raises(GrammarBudgetExceeded, match="--grammar-step-timeout 0.2 s"):
        guard.settle(first)
    assert other.broken is None
    gate.set()
    guard.close()
