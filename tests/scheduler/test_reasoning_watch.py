"""The reasoning watch: the plan from the prompt (protocol/reasoning_watch.py), the scheduler's tracker
(scheduler/reasoning_watch.py) state by state, the sampler's override, and whole requests over the FakeRunner:
a thinking budget (its tokens, then the end marker, then greedy decoding again) with and without the overlap
schedule, and a grammar held while the reasoning runs (it sees only the answer's tokens)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fakes import expected_output, next_token
from scheduler_utils import assert_whole, drain, make, req

from radixlang_runtime.constrained.grammar import CompiledGrammar
from radixlang_runtime.constrained.spec import GrammarSpec
from radixlang_runtime.constrained.step_guard import StepGuard, StepLimits, charge
from radixlang_runtime.model.executor.sampler import Sampler
from radixlang_runtime.model.executor.step_io import SampleSpec
from radixlang_runtime.protocol.limits import FieldError, RuntimeLimits
from radixlang_runtime.protocol.reasoning_watch import (INSIDE, MAY_OPEN, OUTSIDE, ChatWatch, ReasoningWatch,
                                                        ThinkingMarkers, plan_watch, request_watch)
from radixlang_runtime.protocol.sampling_params import SamplingParams
from radixlang_runtime.scheduler.grammar_queue import GrammarQueue
from radixlang_runtime.scheduler.overlap import OverlapSchedule
from radixlang_runtime.scheduler.reasoning_watch import COUNTING, DONE, FORCING, IDLE, WatchTracker

START, END = (200, 201), (202, 203)  # two-token markers, out of the FakeRunner's vocabulary (fakes.VOCAB)
MARKERS = ThinkingMarkers(START, END, starts_inside=False)


def budget(n: int, begins: str = INSIDE, start=START) -> ReasoningWatch:
    return ReasoningWatch(start, END, begins, n)


def test_the_plan_reads_the_prompts_last_marker():
    def begins(prompt, markers=MARKERS, hold=False):
        return plan_watch(prompt, markers, None, hold).begins

    inside_parser = ThinkingMarkers(START, END, starts_inside=True)
    assert begins([1, 2, 3]) == MAY_OPEN
    assert begins([1, 2, 3], inside_parser) == INSIDE
    assert begins([1, *START, 5]) == INSIDE
    assert begins([1, *START, 5, *END, 6], inside_parser) == OUTSIDE  # a template switched thinking off
    assert begins([*START, *END, 7, *START]) == INSIDE
    assert begins([200, 5, 201]) == MAY_OPEN  # the ids apart are not the marker
    assert begins([*START, 9, *END, *range(30)]) == MAY_OPEN  # markers in the history decide nothing
    assert begins([*END, *range(5), *START, *range(8)]) == INSIDE  # the generation prompt's own markup
    assert begins([1, 2, 3], hold=True) == OUTSIDE  # a grammar cannot let a two-token marker through
    assert begins([1, 2, 3], ThinkingMarkers((200,), END, False), hold=True) == MAY_OPEN


def test_the_tracker_counts_inside_then_forces_the_end_marker():
    t = WatchTracker(budget(3))
    out: list[int] = []
    for tok in (5, 6, 7):
        assert t.forced(out) is None and t.state == COUNTING
        out.append(tok)
    assert t.forced(out) == END[0] and t.state == FORCING
    out.append(END[0])
    assert t.forced(out) == END[1]
    out.append(END[1])
    assert t.forced(out) is None and t.state == DONE
    out += [*START, 1, 2, 3, 4]  # a second block is not watched
    assert t.forced(out) is None


def test_the_block_opens_only_at_the_outputs_start():
    t = WatchTracker(budget(2, MAY_OPEN))
    assert t.forced([START[0]]) is None and t.state == IDLE
    assert t.forced([*START]) is None and t.state == COUNTING and t.count == 0
    assert t.forced([*START, 8, *END]) is None and t.state == DONE  # closed by the model within its budget
    late = WatchTracker(budget(2, MAY_OPEN))
    assert late.forced([5, *START, 1, 2, 3]) is None and late.state == DONE  # the output did not open with it
    assert WatchTracker(budget(0, OUTSIDE)).forced([]) is None


def test_a_budget_of_zero_closes_at_once_and_a_begun_end_marker_is_finished():
    assert WatchTracker(budget(0)).forced([]) == END[0]
    assert WatchTracker(budget(2)).forced([5, END[0]]) == END[1]  # the model began the marker as the budget ran out


def test_output_taken_back_is_read_again():
    t = WatchTracker(budget(2))
    assert t.forced([5, 6]) == END[0]
    assert t.forced([5]) is None and t.count == 1


def test_a_held_grammar_and_the_opening_token_it_lets_through():
    t = WatchTracker(ReasoningWatch((200,), END, MAY_OPEN, None, hold_grammar=True))
    assert t.also_allowed([]) == 200 and not t.holds_grammar([])
    assert t.holds_grammar([200]) and t.also_allowed([200]) is None
    assert t.holds_grammar([200, 5, 6, END[0]])
    assert not t.holds_grammar([200, 5, 6, *END]) and t.state == DONE
    first = WatchTracker(ReasoningWatch((200,), END, MAY_OPEN, None, hold_grammar=True))
    assert not first.holds_grammar([7]) and first.state == DONE  # no block: the grammar had the first token
    assert WatchTracker(ReasoningWatch(START, END, INSIDE, None, hold_grammar=True)).holds_grammar([])
    assert WatchTracker(budget(5, MAY_OPEN, start=(200,))).also_allowed([]) is None  # a budget alone holds none


def test_the_sampler_takes_a_forced_token_greedy_or_not():
    logits = torch.tensor([[0.0, 5.0, 1.0, 2.0]] * 3)
    specs = [SampleSpec(SamplingParams.from_dict({"temperature": 0}), [1], []),
             SampleSpec(SamplingParams.from_dict({"temperature": 0}), [1], [], forced=2),
             SampleSpec(SamplingParams.from_dict({"temperature": 1.0}), [1], [], forced=3)]
    assert Sampler(4, [0], torch.device("cpu"), 0).sample(logits.clone(), specs) == [1, 2, 3]


def limits(**kw) -> RuntimeLimits:
    return RuntimeLimits(4096, 300, 4096, **{"reasoning_parser": "qwen3", "thinking_markers": MARKERS.to_wire(),
                                             **kw})


def test_what_the_intake_plans_and_refuses_by_name():
    chat = ChatWatch(True, INSIDE)
    assert request_watch([1, *START], 5, False, None, limits()) == ReasoningWatch(START, END, INSIDE, 5)
    assert request_watch([1, *START], 5, True, None, limits()).hold_grammar  # a budget holds the grammar
    assert request_watch([1, *START], None, True, chat, limits()) == ReasoningWatch(START, END, INSIDE, None, True)
    assert request_watch([1, *START], None, True, None, limits()) is None  # /generate's grammar: from the start
    assert request_watch([1, *START], None, False, chat, limits()) is None  # nothing to hold
    assert request_watch([1, *START], None, True, chat, limits(speculative=True)) is None
    assert request_watch([1, 2], 3, False, ChatWatch(False, INSIDE), limits()).begins == INSIDE  # the chat decides
    cases = [(limits(reasoning_parser="", thinking_markers=()), "without --reasoning-parser"),
             (limits(reasoning_parser="gpt-oss", thinking_markers=()), "gpt-oss has no start / end marker"),
             (limits(speculative=True), "speculative decoding")]
    for lim, why in cases:
        with pytest.raises(FieldError, match=why) as e:
            request_watch([1], 5, False, None, lim)
        assert e.value.param == "thinking_token_budget"
    with pytest.raises(ValueError, match="thinking_token_budget"):
        SamplingParams.from_dict({"thinking_token_budget": -1})


def budget_req(rid: str, n_prompt: int, max_new: int, n: int):
    r = req(rid, n_prompt, max_new, thinking_token_budget=n)
    r.input_ids += list(START)  # the prompt opens the block
    r.sampling.reasoning_watch = plan_watch(r.input_ids, MARKERS, n)
    return type(r)(rid=r.rid, input_ids=r.input_ids, sampling=r.sampling)  # the tracker is built with the Req


def expected(r, budget: int, n: int) -> list[int]:
    head = expected_output(r.input_ids, budget) + list(END)
    return head + expected_output(r.input_ids + head, n - len(head))


def run_mix(overlap: bool):
    """Requests with and without a budget together; each output checked against the request alone."""
    sched, _ = make()
    if overlap:
        sched.overlap = OverlapSchedule(sched)
    plain = [req(f"plain{i}", 6 + 3 * i, 12) for i in range(3)]
    budgets = [(budget_req(f"think{b}", 5 + b, 16, b), b) for b in (0, 1, 4, 9)]
    for r in [*plain, *(r for r, _ in budgets)]:
        sched.add_request(r)
    done = {}
    for _ in range(1000):
        if sched.is_idle:
            break
        done.update({r.rid: r.output_ids for r in sched.step() if r.finished})
    assert_whole(sched)
    for r in plain:
        assert done[r.rid] == expected_output(r.input_ids, 12)
    for r, b in budgets:
        assert done[r.rid] == expected(r, b, 16), r.rid
    return sched


def test_requests_with_and_without_a_budget_together():
    run_mix(overlap=False)


def test_the_overlap_schedule_steps_one_by_one_while_a_budget_may_force():
    sched = run_mix(overlap=True)
    assert sched.overlap.sync_steps > 0
    assert sched.overlap.overlapped_steps > 0  # once no budget could force a token


# ---- a grammar held while the reasoning runs, over the FakeRunner (the test's grammar: every token below 199,
# the markers (200..203) refused, so a marker advanced into it fails the request)
WIDTH, GRAMMAR_EOS = 204, 199


class CountingIndex:
    """An outlines-like index: state = the tokens advanced into it; never final."""

    @staticmethod
    def get_initial_state() -> int:
        return 0

    @staticmethod
    def get_allowed_tokens(state: int) -> list[int]:
        return list(range(GRAMMAR_EOS))

    @staticmethod
    def get_next_state(state: int, token: int):
        return None if token >= GRAMMAR_EOS else state + 1

    @staticmethod
    def is_final_state(state: int) -> bool:
        return False


class Compiler:
    def __init__(self):
        self.guard = StepGuard(StepLimits(30.0, 60.0))
        vocab = SimpleNamespace(logits_width=WIDTH, eos_token_id=GRAMMAR_EOS, sentinel_id=WIDTH)
        self.grammar = CompiledGrammar(GrammarSpec.from_regex("[a-z]+"), CountingIndex(), vocab)
        self.grammar.guard = self.guard

    def start(self) -> None: ...
    def clear(self) -> None: ...

    def submit(self, spec):
        return SimpleNamespace(grammar=self.grammar, error=None, poll=lambda: "ready")

    def close(self) -> None:
        self.guard.close()


@pytest.fixture
def constrained_sched():
    charge(None)
    sched, runner = make()
    comp = Compiler()
    sched.grammar = GrammarQueue(lambda: comp, (GRAMMAR_EOS,), jump_forward=False)
    sched.masks.grammar = sched.drafts.grammar = sched.grammar
    yield sched, runner
    comp.close()
    charge(None)


def held_req(rid: str, prompt_end: list[int], watch: ReasoningWatch, n: int = 14):
    r = req(rid, 6, n, regex="[a-z]+")
    r.input_ids += prompt_end
    r.sampling.reasoning_watch = watch
    return type(r)(rid=r.rid, input_ids=r.input_ids, sampling=r.sampling)


def masked_rows(runner) -> list[bool]:
    """Per sampled row the runner is given from now on: whether a grammar masks it."""
    seen, forward = [], runner.forward

    def spy(batch):
        seen.extend(bool(s.grammar_states) for s in batch.samples if s is not None)
        return forward(batch)

    runner.forward = spy
    return seen


def test_a_budget_holds_the_grammar_until_its_forced_end(constrained_sched):
    sched, runner = constrained_sched
    masked = masked_rows(runner)
    r = held_req("inside", list(START), ReasoningWatch(START, END, INSIDE, 3, hold_grammar=True))
    sched.add_request(r)
    drain(sched)
    assert r.error is None and r.finished_reason["type"] == "length"
    assert masked == [False] * 5 + [True] * 9  # unmasked from the first token to the forced marker
    assert r.output_ids == expected_output(r.input_ids, 3) + list(END) + \
        expected_output(r.input_ids + expected_output(r.input_ids, 3) + list(END), 14 - 5)
    assert r.grammar.state == 14 - 5 and r.grammar_held is None  # the answer's tokens only
    assert_whole(sched)


def test_a_block_the_model_opens_holds_the_grammar_until_it_closes(constrained_sched):
    sched, runner = constrained_sched
    one = ReasoningWatch((200,), END, MAY_OPEN, None, hold_grammar=True)

    def thinks(fill: list[int]) -> int:  # after a prompt ending in 96: <think>, three tokens, </think>, answer
        if fill[-1] == 96:
            return 200
        k = len(fill) - fill.index(200) - 1 if 200 in fill else -1
        return {3: END[0], 4: END[1]}.get(k, next_token(fill))

    runner.next_fn = thinks
    opens, plain = held_req("opens", [96], one), held_req("plain", [95], one)
    for r in (opens, plain):
        sched.add_request(r)
    drain(sched)
    assert opens.error is None and plain.error is None
    assert opens.output_ids[0] == 200 and opens.output_ids[4:6] == list(END)
    assert opens.grammar.state == 14 - 6  # after </think>
    assert plain.grammar.state == 14  # no block: the grammar had every token
    assert_whole(sched)
