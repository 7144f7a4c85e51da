"""MaskGate: a constrained request decodes only once the mask of its next state is computed, so a slow grammar
costs its own request steps, never the batch's time. Torch-free.

After a constrained request's token is sampled and its grammar advanced, the scheduler starts the next
state's mask on the step guard's thread (GrammarQueue.prefetch, constrained/mask_prefetch.py) and `hold`s the
request here. At the end of the step `settle` waits for those masks together, at most LATE_MASK_WAIT times the
forward pass just run (a grammar as fast as usual is ready by then: the request takes the next step as
before). A mask ready by then, or at any later step's start, lets the request go on: the checks that read
it (the grammar must finish here: a stop without a forward pass) and its jump-forward draft. A mask not ready
leaves the request `mask_pending`: it sits out decode steps (its slots and KV stay) while the mask computes
beside the other requests' forward passes, and rejoins at the first step that finds it ready. A mask past
the step timeout, or a request past its grammar budget, ends that request alone (an abort naming the flag),
as a blocking grammar call would.

Invariants: a request in a decode batch has its mask cached (sampling never waits on a decode row's grammar);
the requests `settle` ends are finished, their slots released by the caller; `mask_pending` is False for
every request not waiting on a mask.
"""

from __future__ import annotations

import time
from typing import Any

from radixlang_runtime.constrained.step_guard import GrammarBudgetExceeded
from radixlang_runtime.scheduler.request import Req

# How long, relative to the forward pass just run, a step waits for the masks of its constrained requests
# before leaving the late ones out of the next step: a late mask lengthens a step by at most this fraction.
LATE_MASK_WAIT = 0.5
IDLE_MASK_WAIT_S = 0.01  # nothing else to run: the loop waits this long for a mask, then looks for messages


class MaskGate:
    def __init__(self, grammar: Any, drafts: Any):
        self.grammar = grammar  # GrammarQueue
        self.drafts = drafts  # Drafts: jump-forward drafts once the mask is known
        self.held: list[Req] = []  # requests whose next mask was submitted this step (read, never edited, outside)
        self.late = 0  # masks that were not ready by the end of their step (the request sat out)

    def hold(self, req: Req) -> None:
        """req's next mask was submitted (prefetch): its mask-reading checks wait for `settle`."""
        self.held.append(req)

    def take_held(self) -> list[Req]:
        held, self.held = self.held, []
        return held

    def settle(self, reqs: list[Req], until: float, batch_size: int) -> list[Req]:
        """Wait until `until` (monotonic) at most for each request's mask; ready ones go on (must-finish check,
        draft), others are left mask_pending. -> the requests that finished here (a must-finish state, or
        a grammar past its limits)."""
        ended = []
        for req in reqs:
            if req.finished or req.grammar is None:
                req.mask_pending = False
                continue
            try:
                ready = self.grammar.collect(req, max(0.0, until - time.monotonic()))
                if not ready and not req.mask_pending:
                    self.late += 1
                req.mask_pending = not ready
                if ready:
                    if req.grammar.must_finish:  # complete, nothing may follow: no more passes
                        req.finish({"type": "stop", "matched": None})
                    self.drafts.propose(req, batch_size)
            except GrammarBudgetExceeded as e:
                req.mask_pending = False
                req.draft, req.draft_states = [], []
                if not req.finished:
                    req.finish({"type": "abort", "message": str(e)})
            if req.finished:
                ended.append(req)
        return ended
