"""A request's thinking-token budget, the scheduler's side (torch-free): which token, if any, its next sample
must be (the plan: protocol/thinking_budget.py).

States, as llama.cpp's reasoning-budget sampler: IDLE (outside the block, watching for the start marker),
COUNTING (inside: each output token counts; the end marker, emitted by the model, ends the watch), FORCING
(the budget is spent: the end marker's ids are forced one per step), DONE (passthrough for good). A plan whose
output begins inside the block starts COUNTING.

The tracker reads the request's output ids, so it is a function of them: it follows the tokens it has not
seen yet on each call (sampled, accepted from a draft, handed over by a prefill server), and a request whose
output was taken back (never done today) is read again from its start.
"""

from __future__ import annotations

from typing import Optional

from radixlang_runtime.protocol.thinking_budget import ThinkingBudget

IDLE, COUNTING, FORCING, DONE = "idle", "counting", "forcing", "done"


class BudgetTracker:
    def __init__(self, plan: ThinkingBudget):
        self.plan = plan
        self._reset()

    def _reset(self) -> None:
        self.state = IDLE
        self.count = 0  # output tokens inside the block
        self.forced_at = 0  # FORCING: how many of the end marker's ids are out
        self.seen = 0  # output tokens read
        self._tail: list[int] = []  # the last output ids, as long as the longer marker
        if self.plan.inside:
            self._enter()

    def _enter(self) -> None:
        self.state, self.count = COUNTING, 0
        self._spent()

    def _spent(self) -> None:
        if self.count >= self.plan.budget:
            self.state, self.forced_at = FORCING, self._end_prefix()

    def _end_prefix(self) -> int:
        """How much of the end marker the output already ends with (a multi-token marker begun by the model)."""
        end = self.plan.end
        for k in range(min(len(end) - 1, len(self._tail)), 0, -1):
            if tuple(self._tail[-k:]) == end[:k]:
                return k
        return 0

    def _ends_with(self, marker: tuple[int, ...]) -> bool:
        return len(self._tail) >= len(marker) and tuple(self._tail[-len(marker):]) == marker

    def _feed(self, token: int) -> None:
        self._tail.append(token)
        del self._tail[:-max(len(self.plan.start), len(self.plan.end))]
        if self.state == IDLE:
            if self._ends_with(self.plan.start):
                self._enter()
        elif self.state == COUNTING:
            if self._ends_with(self.plan.end):
                self.state = DONE
            else:
                self.count += 1
                self._spent()
        elif self.state == FORCING:
            self.forced_at += 1
            if self.forced_at >= len(self.plan.end):
                self.state = DONE

    def advance(self, output_ids: list[int]) -> None:
        if len(output_ids) < self.seen:
            self._reset()
        for t in output_ids[self.seen:]:
            if self.state == DONE:
                break
            self._feed(t)
        self.seen = len(output_ids)

    def forced(self, output_ids: list[int]) -> Optional[int]:
        """The token the next sample must be after `output_ids` (None: the sampler decides)."""
        self.advance(output_ids)
        return self.plan.end[self.forced_at] if self.state == FORCING else None

    @property
    def active(self) -> bool:
        """It may still force a token: its next sample depends on the token before (no overlap, no draft)."""
        return self.state != DONE
