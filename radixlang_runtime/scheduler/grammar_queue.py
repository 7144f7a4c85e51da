"""GrammarQueue: constrained requests wait here while their grammar compiles; token-level grammar steps.

Torch-free. A request whose sampling params carry a regex / json_schema enters `add`; its grammar is
submitted to the GrammarCompiler (compiles in worker processes, never on the scheduler thread) and the
request waits in `pending` until `poll` finds it ready (it then joins the scheduler's waiting queue
with a GrammarState) or failed (it ends with a 400-class error naming the problem). Other requests
keep running meanwhile.

After every sampled token the scheduler calls `advance`, then `prefetch`: the next state's mask computes on the
step guard's thread, and `collect` tells when it is ready (scheduler/mask_gate.py holds the request until
then). The first mask computes the same way while the request is still `pending` here after its compile.
With jump-forward on, `draft` returns the
tokens the grammar forces next. They ride in the next forward pass as a multi-token extend and are
verified there (model/executor/sample_step.py): each is kept only if the model, sampling at that position,
picks it, so the output is what token-by-token decoding gives. Invariants:
- a GrammarState's position always equals the request's output_ids (retraction keeps both);
- finish ids (EOS unless ignore_eos, plus stop_token_ids) are accepted only in final states;
- a draft never includes a finish id and never rewrites a sampled token;
- every grammar call is charged to the request's GrammarBudget (constrained/step_guard.py): one past the
  step or request limit raises GrammarBudgetExceeded, and the scheduler ends that request alone (an
  abort naming the limit; at admission a 400 like a compile error).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from radixlang_runtime.scheduler.request import Req

logger = logging.getLogger(__name__)

GRAMMAR_ERROR_STATUS = 400  # a grammar that cannot be compiled is the request's fault
# Most forced tokens drafted per step: a grammar forcing a long literal is walked one window a step, so
# one step's grammar work stays bounded (the verified output is the same for any window).
JUMP_FORWARD_WINDOW = 64


class GrammarQueue:
    def __init__(self, make_compiler: Callable[[], Any], end_ids: tuple[int, ...], jump_forward: bool = True):
        """make_compiler: builds the GrammarCompiler on first use (its vocabulary takes ~0.5 s to build)."""
        self._make_compiler = make_compiler
        self._compiler: Optional[Any] = None
        self.end_ids = end_ids
        self.jump_forward = jump_forward
        self.pending: list[Req] = []
        self.forced_tokens_total = 0

    @property
    def compiler(self) -> Any:
        if self._compiler is None:
            self._compiler = self._make_compiler()
            self._compiler.start()
        return self._compiler

    def add(self, req: Req) -> None:
        from radixlang_runtime.constrained.spec import spec_from_sampling

        # the spec the intake built (carried by the message); a SamplingParams made without from_dict
        # (scheduler unit tests) has none yet
        sp = req.sampling
        spec = sp.grammar or spec_from_sampling(sp.regex, sp.json_schema, sp.ebnf, sp.structural_tag)
        req.grammar_handle = self.compiler.submit(spec)
        self.pending.append(req)

    def poll(self) -> tuple[list[Req], list[Req]]:
        """(requests whose grammar is ready and whose first mask is computed: GrammarState attached; requests
        whose grammar failed: error set). Never blocks: the first mask is computed on the step guard's thread
        (mask_prefetch.py) while the request waits here, under the step budget (not inside a forward pass)."""
        from radixlang_runtime.constrained.state import GrammarState
        from radixlang_runtime.constrained.step_guard import GrammarBudgetExceeded

        ready, failed, still = [], [], []
        for req in self.pending:
            h = req.grammar_handle
            status = "ready" if h is None else h.poll()  # None: compiled, its first mask under way
            if status == "pending":
                still.append(req)
                continue
            req.grammar_handle = None
            if status == "ready":
                if req.grammar is None:
                    sp = req.sampling
                    finish = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(self.end_ids))
                    state = GrammarState(h.grammar, finish, budget=self.compiler.guard.new_budget())
                    if req.watch is not None and req.watch.holds_grammar(req.output_ids):
                        req.grammar_held = state  # the output begins inside the reasoning: no mask yet
                        ready.append(req)
                        continue
                    req.grammar = state
                try:
                    if not self.collect(req, 0.0):
                        still.append(req)
                        continue
                except GrammarBudgetExceeded as e:
                    req.error, req.error_status = f"grammar error: {e}", GRAMMAR_ERROR_STATUS
                    failed.append(req)
                    continue
                ready.append(req)
            else:
                req.error, req.error_status = f"grammar error: {h.error}", GRAMMAR_ERROR_STATUS
                failed.append(req)
        self.pending = still
        return ready, failed

    @staticmethod
    def prefetch(req: Req) -> None:
        """Start computing the mask of the state the request's grammar stands at (mask_prefetch.py)."""
        from radixlang_runtime.constrained.mask_prefetch import prefetch

        prefetch(req.grammar)

    @staticmethod
    def collect(req: Req, timeout: float) -> bool:
        """True once the mask of the request's grammar state is cached (waits up to timeout s for it);
        GrammarBudgetExceeded past the request's limits."""
        from radixlang_runtime.constrained.mask_prefetch import collect

        return collect(req.grammar, timeout)

    def remove(self, rid_set: set[str]) -> list[Req]:
        gone = [r for r in self.pending if r.rid in rid_set]
        self.pending = [r for r in self.pending if r.rid not in rid_set]
        return gone

    def take_all(self) -> list[Req]:
        gone, self.pending = self.pending, []
        return gone

    # ------------------------------------------------------------------ per token
    @staticmethod
    def advance(req: Req, token_id: int) -> bool:
        """Move the request's grammar over a sampled token; False when the grammar refuses it."""
        return req.grammar.advance(token_id)

    def draft(self, req: Req) -> tuple[list[int], list[Any]]:
        """Jump-forward: the tokens the grammar forces after the request's output so far (up to
        max_new_tokens), as a draft the next forward pass verifies, and the GrammarState before each
        draft token plus the one after all (the masks of the verification rows). The request's own
        state does not move: accepted tokens advance it when they are appended. ([], []) when off."""
        if not self.jump_forward or req.grammar is None or req.remaining_new_tokens <= 1:
            return [], []
        from radixlang_runtime.constrained.jump_forward import draft_tokens, guess_tokens
        from radixlang_runtime.constrained.step_guard import charge

        charge(req.grammar.budget)  # forced strings are this request's grammar work
        probe = req.grammar.copy()
        room = min(req.remaining_new_tokens - 1, JUMP_FORWARD_WINDOW)  # room for the model's own token
        toks = draft_tokens(probe, max_tokens=room)
        toks += guess_tokens(probe, max_tokens=room - len(toks))  # the held-back tail, for the model to verify
        if not toks:
            return [], []
        states, walk = [req.grammar.copy()], req.grammar.copy()
        for t in toks:
            walk.advance(t)
            states.append(walk.copy())
        self.forced_tokens_total += len(toks)
        return toks, states

    @staticmethod
    def learn(state_before: Any, sampled: int) -> None:
        """The model sampled `sampled` where the draft had another token (see jump_forward.draft_tokens)."""
        from radixlang_runtime.constrained.jump_forward import learn_rejection

        learn_rejection(state_before, sampled)

    def clear_cache(self) -> None:
        """/flush_cache: drop the compiled grammars (those of running requests live until they end)."""
        if self._compiler is not None:
            self._compiler.clear()

    def close(self) -> None:
        if self._compiler is not None:
            self._compiler.close()
