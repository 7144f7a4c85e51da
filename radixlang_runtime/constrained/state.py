"""GrammarState: one request's position in its grammar. Torch-free.

Lifecycle (what the scheduler does):
  admission      GrammarState(grammar, finish_ids) once the GrammarHandle is ready; finish_ids = the
                 runtime's EOS ids (unless ignore_eos) + the request's stop_token_ids.
  each step      mask.py reads `allowed()` / `is_final` / `finish_ids` of every constrained row.
  after a token  advance(token) -> False when the token is illegal (a bug or a mask not applied: the
                 caller aborts the request); then jump_forward.forced_tokens(state) for forced ones.
  finish         when `terminated` (a finish id was accepted) or `must_finish` (final, no continuation).

Invariants:
- `state` is always a live Index state: it has allowed text tokens, or is final, or both.
- A finish id is accepted only in a final state; after it the state is terminated and accepts nothing.
- Retraction keeps output ids, so it keeps the state too (no rollback needed).
- Every grammar call is charged to `budget` (step_guard.charge); a call past the request's limits raises
  step_guard.GrammarBudgetExceeded, which ends this request only (the scheduler catches it).
"""

from __future__ import annotations

from typing import Iterable, Optional

from radixlang_runtime.constrained.grammar import AllowedSet, CompiledGrammar
from radixlang_runtime.constrained.step_guard import GrammarBudget, GrammarBudgetExceeded, charge


class GrammarState:
    __slots__ = ("grammar", "state", "finish_ids", "terminated", "num_forced", "budget")

    def __init__(self, grammar: CompiledGrammar, finish_ids: Iterable[int] = (), state: int | None = None,
                 budget: Optional[GrammarBudget] = None):
        self.grammar = grammar
        self.budget = budget  # the request's grammar time (step_guard.py), shared by copies; None: unbounded
        self.state: int = grammar.initial_state if state is None else state
        w = grammar.vocab.logits_width
        self.finish_ids: tuple[int, ...] = tuple(sorted({t for t in finish_ids if 0 <= t < w}))
        self.terminated = False  # a finish id was accepted
        self.num_forced = 0  # tokens appended by jump-forward (meta_info.forced_tokens)

    # ------------------------------------------------------------------ queries
    def _charge(self) -> None:
        """The grammar calls that follow are this request's; a spent budget raises (not even a cached mask)."""
        b = self.budget
        if b is not None and b.error:
            raise GrammarBudgetExceeded(b.error)
        charge(b)

    def allowed(self) -> AllowedSet:
        self._charge()
        return self.grammar.allowed(self.state)

    @property
    def is_final(self) -> bool:
        return self.grammar.is_final(self.state)

    @property
    def can_finish(self) -> bool:
        """The output so far is a complete match: EOS / stop tokens are allowed now."""
        return not self.terminated and self.is_final

    @property
    def must_finish(self) -> bool:
        """Complete and nothing can follow: finish now (no forward pass needed)."""
        return self.terminated or (self.is_final and len(self.allowed().ids) == 0)

    def is_allowed(self, token_id: int) -> bool:
        if self.terminated:
            return False
        self._charge()
        if token_id in self.finish_ids:
            return self.is_final
        return self.grammar.next_state(self.state, token_id) is not None

    # ------------------------------------------------------------------ transitions
    def advance(self, token_id: int) -> bool:
        """Move over one token. False (state unchanged) when the grammar does not allow it here."""
        if self.terminated:
            return False
        self._charge()
        if token_id in self.finish_ids:
            if not self.is_final:
                return False
            self.terminated = True
            return True
        nxt = self.grammar.next_state(self.state, token_id)
        if nxt is None:
            return False
        self.state = nxt
        return True

    def advance_all(self, token_ids: Iterable[int]) -> bool:
        """advance() each; stops at the first illegal token (returns False, earlier ones stay applied)."""
        return all(self.advance(t) for t in token_ids)

    def copy(self) -> "GrammarState":
        """An independent state at the same position (n > 1 samples, forks)."""
        c = GrammarState(self.grammar, (), self.state, self.budget)
        c.finish_ids = self.finish_ids
        c.terminated = self.terminated
        c.num_forced = self.num_forced
        return c

    def __repr__(self) -> str:
        return f"GrammarState({self.grammar.spec.describe()}, state={self.state}, final={self.is_final})"
