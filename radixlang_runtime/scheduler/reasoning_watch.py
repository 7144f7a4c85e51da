"""A request's reasoning watch, the scheduler's side (torch-free): which token its next sample must be (a spent
budget), which one a held grammar lets through besides its own (a block opening the output), and whether the
request's grammar is held (the plan: protocol/reasoning_watch.py).

States, as llama.cpp's reasoning-budget sampler: IDLE (the output so far is a proper prefix of the start
marker: the block may still open), COUNTING (inside: each output token counts; the end marker, emitted by the
model, closes the block), FORCING (the budget is spent: the end marker's ids are forced one per step), DONE (no
block, or it closed: nothing is watched again). A plan that begins inside starts COUNTING, one that begins
outside starts DONE; the block opens only at the output's start, as the reasoning parsers read it.

The watch reads the request's output ids, so it is a function of them: it follows the tokens it has not
seen yet on each call (sampled, accepted from a draft, handed over by a prefill server), and an output that
was taken back is read again from its start.
"""

from __future__ import annotations

from typing import Optional

from radixlang_runtime.protocol.reasoning_watch import INSIDE, OUTSIDE, ReasoningWatch

IDLE, COUNTING, FORCING, DONE = "idle", "counting", "forcing", "done"


class WatchTracker:
    def __init__(self, plan: ReasoningWatch):
        self.plan = plan
        self._reset()

    def _reset(self) -> None:
        self.state = IDLE
        self.count = 0  # output tokens inside the block
        self.forced_at = 0  # FORCING: how many of the end marker's ids are out
        self.seen = 0  # output tokens read
        self._tail: list[int] = []  # the last output ids, as long as the longer marker
        if self.plan.begins == INSIDE:
            self._enter()
        elif self.plan.begins == OUTSIDE:
            self.state = DONE

    def _enter(self) -> None:
        self.state, self.count = COUNTING, 0
        self._spent()

    def _spent(self) -> None:
        if self.plan.budget is not None and self.count >= self.plan.budget:
            self.state, self.forced_at = FORCING, self._end_prefix()

    def _end_prefix(self) -> int:
        """How much of the end marker the output already ends with (a multi-token marker begun by the model)."""
        end = self.plan.end
        for k in range(min(len(end) - 1, len(self._tail)), 0, -1):
            if tuple(self._tail[-k:]) == end[:k]:
                return k
        return 0

    def _feed(self, token: int) -> None:
        self._tail.append(token)
        del self._tail[:-max(len(self.plan.start), len(self.plan.end))]
        if self.state == IDLE:
            opened = tuple(self._tail[-self.seen - 1:]) if self.seen < len(self.plan.start) else ()
            if opened == self.plan.start:
                self._enter()
            elif opened != self.plan.start[:len(opened)] or not opened:
                self.state = DONE  # the output does not open with the marker
        elif self.state == COUNTING:
            end = self.plan.end
            if len(self._tail) >= len(end) and tuple(self._tail[-len(end):]) == end:
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
            self.seen += 1
        self.seen = len(output_ids)

    def forced(self, output_ids: list[int]) -> Optional[int]:
        """The token the next sample must be after `output_ids` (None: the sampler decides)."""
        self.advance(output_ids)
        return self.plan.end[self.forced_at] if self.state == FORCING else None

    def holds_grammar(self, output_ids: list[int]) -> bool:
        """The request's grammar waits: the output is inside the block (or a marker is being forced)."""
        self.advance(output_ids)
        return self.plan.hold_grammar and self.state in (COUNTING, FORCING)

    def also_allowed(self, output_ids: list[int]) -> Optional[int]:
        """A token the next sample may take besides what the request's grammar allows: the one-token start
        marker, while the output has not begun (plan_watch leaves longer markers out)."""
        self.advance(output_ids)
        if self.plan.hold_grammar and self.state == IDLE and not output_ids:
            return self.plan.start[0]
        return None

    @property
    def active(self) -> bool:
        """It may still force a token or move the grammar: its next step depends on the token before."""
        return self.state != DONE
