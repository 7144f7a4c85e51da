"""Drafts, the scheduler's side (torch-free): which requests carry a draft into the next step, and what a
verified one adds to their output. Owned by the Scheduler (self.drafts).

Two sources, one slot (req.draft): n-gram speculation for unconstrained requests (--speculative-algorithm
NGRAM, speculative/drafter.py) and jump-forward for constrained ones (the tokens their grammar forces,
scheduler/grammar_queue.py; req.draft_states holds the grammar state at each draft position). The runner
verifies a draft in the next forward pass (model/executor/sample_step.py) and reports how many of its tokens the
model agreed with (StepResult.accepted); those tokens then join the output here, each checked like a
sampled token, before the step's sampled token.
Invariants: an n-gram draft is only a proposal (dropping one changes nothing but speed, so memory
pressure and large batches drop them); a jump-forward draft is never dropped that way (its grammar
states must stay aligned with it), and never contains a finish id.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional

from radixlang_runtime.model.executor.step_io import StepLogprobs
from radixlang_runtime.speculative.drafter import NgramDrafter, trim_to_cost
from radixlang_runtime.speculative.spec_cost import EXPLORE, StepCost, adaptive_from_env

if TYPE_CHECKING:  # annotations only: the scheduler drives these, they never call it
    from radixlang_runtime.scheduler.grammar_queue import GrammarQueue
    from radixlang_runtime.scheduler.request import Req


MODEL_EXPLORE_BATCH = 4  # a vetoed draft model explores only at batches up to this (catching up <= 4 x EXPLORE)


class Drafts:
    def __init__(self, drafter: Optional[NgramDrafter], grammar: Optional[GrammarQueue],
                 check_finished: Callable[[Req], None]):
        self.drafter = drafter  # None: no n-gram speculation (--speculative-algorithm unset)
        self.max_draft: Optional[int] = None  # draft tokens per request at most (hybrid models' verify scratch)
        self.grammar = grammar  # None: no constrained requests, so no jump-forward drafts
        self._check_finished = check_finished
        self.spec_draft_tokens = 0  # n-gram draft tokens verified, all requests (stats)
        self.spec_accepted_tokens = 0  # of which accepted
        # NGRAM with the cost rule (cfg.row_cost > 0): this machine's decode step cost a + b * rows, measured
        # online from the steps themselves (speculative/spec_cost.py), seeded with cfg.row_cost; None: no rule
        row_cost = getattr(getattr(drafter, "cfg", None), "row_cost", 0.0)
        self.cost = StepCost(row_cost, adaptive=adaptive_from_env()) if row_cost > 0 else None
        self._vetoes = 0  # gated steps whose drafts the realized check (StepCost.drafts_pay) dropped
        self._model_vetoes: dict[int, int] = {}  # a draft model's vetoed steps per batch size regime
        self._step_accepted = 0  # n-gram draft tokens accepted in the step being applied (note_step resets)
        self._step_forced = False  # a jump-forward draft was accepted in it: its tokens are not counted here
        self._draft_seconds = 0.0  # the draft model's time for the coming step's drafts (note_step resets)

    # ------------------------------------------------------------------ proposing
    def propose(self, req: Req, batch_size: int) -> None:
        """After a sampled token was appended and checked: the draft the request carries into its next step
        (n-gram while the decode batch of `batch_size` is small enough; jump-forward's forced tokens)."""
        if req.grammar is None:
            if self.drafter is not None and not req.finished and self.speculate(batch_size):
                req.draft = self.drafter.draft(req) if self._may_pay(req, batch_size) else []
        else:
            req.draft, req.draft_states = ([], []) if req.finished else self.grammar.draft(req)
        if self.max_draft is not None and len(req.draft) > self.max_draft:  # a prefix of a draft is one too
            req.draft, req.draft_states = req.draft[:self.max_draft], req.draft_states[:self.max_draft + 1]

    def _may_pay(self, req: Req, batch_size: int) -> bool:
        """With the cost rule: whether a lookup could give a first row that pays at this batch size (trim_to_cost's
        test for a lone row, v (1 + c B) > c B), v judged from the request's last match: agree.p of its length (a
        copy goes on: its match grows while it lasts). A request never looked up is; one whose last match could not
        pay is looked up again one step in EXPLORE (its text may have turned to copying). The lookup skipped costs
        ~2% of a batch-64 step, for rows the rule would cut anyway."""
        if not self._cost_rule() or req.spec_index is None:
            return True
        c = self.cost.ratio(batch_size) * batch_size
        if self.drafter.agree.p(max(1, req.spec_match)) * (1.0 + c) > c:
            return True
        req.spec_idle += 1
        return req.spec_idle % EXPLORE == 0

    def speculate(self, batch_size: int) -> bool:
        """N-gram drafts only while the decode batch is at most --speculative-disable-by-batch-size (0: always):
        larger batches are compute bound, where rejected draft rows cost real time."""
        limit = self.drafter.cfg.disable_batch_size
        return limit <= 0 or batch_size <= limit

    def gate(self, running: list[Req]) -> None:
        """Before a step over `running`: drop drafts when the batch is too large to speculate; else a draft model
        (STANDALONE, speculative/model_drafter.py) drafts here, batched, for the requests it marked, and n-gram
        drafts are cut to the rows whose expected accepted tokens pay for their cost (drafter.trim_to_cost, with
        this machine's measured cost ratio for a batch of this size: spec_cost.StepCost), or all dropped while
        this batch size's drafted steps were measured slower than its plain ones (but one step in EXPLORE)."""
        if self.drafter is None:
            return
        model = hasattr(self.drafter, "fill")  # a draft model (STANDALONE): it drafts on every step it may
        if not self.speculate(len(running)):
            self._step_aside(running)
            return
        if model and self._cost_rule() and self.cost.wants_plain(len(running)):
            self._step_aside(running)  # a plain sample for the comparison below (a draft model drafts every step)
            return
        if self._cost_rule() and not self.cost.drafts_pay(len(running)):
            # drafted steps were slower than plain ones, measured: drafts are still tried one step in EXPLORE
            # (the drafted rate stays measured, a veto lifts when drafts pay again); a draft model's explored
            # step costs several plain ones (its proposal, and first catching up every request's skipped steps),
            # so it explores only up to MODEL_EXPLORE_BATCH requests, at the regime's EXPLORE-th, 2 EXPLORE-th,
            # 4 EXPLORE-th ... vetoed step (the cost of exploring fades; a veto lifts later the longer it held)
            self._vetoes += 1
            if model:
                regime = self.cost.regime(len(running))
                n = self._model_vetoes[regime] = self._model_vetoes.get(regime, 0) + 1
                explore = len(running) <= MODEL_EXPLORE_BATCH and n >= EXPLORE and n & (n - 1) == 0
            else:
                explore = self._vetoes % EXPLORE == 0
            if not explore:
                self._step_aside(running)
                return
        if model:  # its proposal's time counts against the drafted step's rate (note_step); not its catching up
            # (the mirror's deferred work, once per request per gap, not a property of drafting at this batch size)
            began, began_cpu = time.perf_counter(), time.process_time()
            caught = self.drafter.fill(running)
            self._draft_seconds += max(0.0, min(time.perf_counter() - began, time.process_time() - began_cpu) - caught)
        elif self._cost_rule():
            trim_to_cost(running, self.cost.ratio(len(running)))

    def _step_aside(self, running: list[Req]) -> None:
        """No drafts for the coming step: n-gram ones dropped; a draft model neither proposes nor mirrors it."""
        self.drop_ngram(running)
        if hasattr(self.drafter, "pause"):
            self.drafter.pause()

    def _cost_rule(self) -> bool:
        """The cost rule applies while the drafter's row_cost is > 0 (read live: setting it to 0 on a running
        scheduler turns the rule off, every draft then verified at any batch size)."""
        return self.cost is not None and getattr(self.drafter.cfg, "row_cost", 0.0) > 0

    def note_step(self, requests: int, rows: int, all_decode: bool, wall: float, cpu: float) -> None:
        """After a step (Scheduler.step: the forward pass and applying its result): a step where every request
        decoded (its token + any draft, verified as decode rows) is a sample of the step cost model. Its cost is
        the smaller of its wall time and the process's CPU time over it: on an idle machine with one thread they
        agree; other processes' load inflates only the wall time (preemption), several torch threads only the
        CPU time, so the smaller is the one closer to what the step itself costs."""
        tokens = 0 if self._step_forced else requests + self._step_accepted  # produced (0: unknown)
        extra, self._step_accepted, self._step_forced, self._draft_seconds = self._draft_seconds, 0, False, 0.0
        if self.cost is not None and all_decode:
            self.cost.record(requests, rows, min(wall, cpu), tokens, extra)

    @staticmethod
    def drop_ngram(reqs: list[Req]) -> None:
        """Unverified n-gram drafts are only proposals: dropping one changes nothing but speed."""
        for r in reqs:
            if r.grammar is None:
                r.draft = []

    # ------------------------------------------------------------------ accepting
    def accept(self, req: Req, accepted: int, sampled: int, lp: Optional[StepLogprobs]) -> None:
        """req verified its draft this step: its first `accepted` tokens join the output (the draft is cleared)."""
        if req.grammar is None:
            self._accept_ngram(req, accepted, lp)
        else:
            self._accept_jump_forward(req, accepted, sampled)

    def _accept_jump_forward(self, req: Req, accepted: int, sampled: int) -> None:
        """Append the first `accepted` draft tokens as output, each checked like a sampled token.
        A rejected draft token teaches the grammar the model's own choice there (`sampled`)."""
        draft, states, req.draft, req.draft_states = req.draft, req.draft_states, [], []
        self._step_forced = True
        if accepted < len(draft):
            self.grammar.learn(states[accepted], sampled)
        for t in draft[:accepted]:
            req.output_ids.append(t)
            req.forced_tokens += 1
            self.grammar.advance(req, t)
            if req.return_logprob:  # verified, not sampled: a null logprob entry keeps the lists aligned
                req.output_logprobs.append(None)
                if req.top_logprobs_num > 0:
                    req.output_top_logprobs.append(None)
            self._check_finished(req)
            if req.finished:
                return
        if req.grammar.must_finish:
            req.finish({"type": "stop", "matched": None})

    def _accept_ngram(self, req: Req, accepted: int, lp: Optional[StepLogprobs]) -> None:
        """Append the first `accepted` n-gram draft tokens as output, each with its logprob from its own
        verification row (what decoding it alone gives) and checked like a sampled token; a stop ends it
        there (the rest of the draft, and the step's sampled token, are dropped)."""
        draft, req.draft = req.draft, []
        self.drafter.update(req, len(draft), accepted)
        self.spec_draft_tokens += len(draft)
        self.spec_accepted_tokens += accepted
        self._step_accepted += accepted
        for j, t in enumerate(draft[:accepted]):
            if req.return_logprob:
                req.output_logprobs.append(lp.draft_vals[j])
                if req.top_logprobs_num > 0:
                    req.output_top_logprobs.append(lp.draft_top[j])
            req.output_ids.append(t)
            self._check_finished(req)
            if req.finished:
                return
