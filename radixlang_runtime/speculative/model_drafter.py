"""ModelDrafter: --speculative-algorithm STANDALONE, the scheduler's side (torch-free; docs/SPECULATIVE.md).

A draft model (speculative/draft_model.py, reached only through the `propose` callable wiring.py hands in) proposes
num_steps greedy tokens per request; the next forward pass verifies them like an n-gram draft (point-mass
acceptance, model/executor/sample_step.py), so the emitted tokens are exactly the target's (greedy: the same ids).

Two phases, because the draft model runs batched: `draft(req)` (Drafts.propose, after a request's sampled
token) only marks the request; `fill(running)` (Drafts.gate, right before the next decode / mixed step is
planned) runs the draft model once for every marked request still running and sets req.draft. A draft is a
proposal like an n-gram one: memory pressure, retraction and large batches drop it (Drafts.drop_ngram).

Same refusals as NGRAM (`_draftable`): constrained requests (jump-forward is their draft), penalties, seeds,
min_new_tokens not reached; a draft never runs past max_new_tokens (room for the model's own token) or the
context, and is cut before its first finish id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from radixlang_runtime.speculative.accept_stats import AcceptStats
from radixlang_runtime.speculative.drafter import ROW_COST

if TYPE_CHECKING:  # annotations only: the scheduler drives these, they never call it
    from radixlang_runtime.scheduler.request import Req

# propose(rows, prefix_lens, last_tokens, k, rewrites, kv_slots, history) -> ([B][k] draft tokens, seconds spent
# catching up) (model/draft_model.DraftModel.propose; history(b): request b's tokens, for a draft that must catch up)
ProposeFn = Callable[[list[int], list[int], list[int], int, list[tuple[int, list[int]]], list[list[int]],
                      Callable[[int], list[int]]], tuple[list[list[int]], float]]


@dataclass
class ModelDraftConfig:
    num_steps: int  # draft tokens per step (--speculative-num-steps)
    disable_batch_size: int = 0  # no drafts while the decode batch has more requests (0: no limit)
    row_cost: float = ROW_COST  # > 0: the realized-rate check decides when to step aside (speculative/drafts.py)


class ModelDrafter:
    def __init__(self, cfg: ModelDraftConfig, propose: ProposeFn, eos_token_ids: tuple[int, ...], context_len: int,
                 set_mirror: Optional[Callable[[bool], None]] = None, name: str = "STANDALONE"):
        self.name = name  # --speculative-algorithm
        self.cfg = cfg
        self._propose = propose
        self._set_mirror = set_mirror  # DraftModel.set_active: mirror the coming steps or not
        self.eos_token_ids = eos_token_ids
        self.context_len = context_len
        self._marked: dict[int, Req] = {}  # id(req) -> req: wants a draft before its next step
        self.accept_stats = AcceptStats()
        self.draft_calls = 0  # batched draft-model runs (stats)

    def _draftable(self, req: Req) -> bool:
        sp = req.sampling
        return (req.grammar is None and not sp.has_penalties and sp.sampling_seed is None
                and len(req.output_ids) >= sp.min_new_tokens)

    def _room(self, req: Req) -> int:
        """Most draft tokens for req now: room for the model's own token, every position inside the context."""
        return min(self.cfg.num_steps, req.remaining_new_tokens - 1, self.context_len - req.seq_len - 1)

    def draft(self, req: Req) -> list[int]:
        """Mark req for the next batched fill; the draft itself comes from fill()."""
        if self._draftable(req) and self._room(req) > 0:
            self._marked[id(req)] = req
        return []

    def pause(self) -> None:
        """Drafting steps aside for the coming step (Drafts.gate): no proposal, and the draft mirrors nothing
        (its K/V of the step's tokens is caught up when a request drafts again)."""
        self._marked.clear()
        if self._set_mirror is not None:
            self._set_mirror(False)

    def fill(self, running: list[Req]) -> float:
        """One batched draft-model run for the marked requests of `running` that carry no draft yet; the coming
        step is mirrored. Returns the seconds the draft spent catching up K/V it had skipped (0: none)."""
        if self._set_mirror is not None:
            self._set_mirror(True)
        reqs = [r for r in running if self._marked.pop(id(r), None) is not None and not r.finished and not r.draft
                and r.kv_len == r.seq_len - 1]
        self._marked.clear()  # marks of requests not running now (retracted, finished): their next sample re-marks
        if not reqs:
            return 0.0
        ks = [self._room(r) for r in reqs]
        rewrites = [(r.table_idx, list(r.kv_indices)) for r in reqs if r.row_dirty and r.kv_len]
        self.draft_calls += 1
        props, caught = self._propose([r.table_idx for r in reqs], [r.kv_len for r in reqs],
                                      [r.output_ids[-1] for r in reqs], max(ks), rewrites, [r.kv_indices for r in reqs],
                                      lambda b: reqs[b].input_ids + reqs[b].output_ids)
        for r, k, toks in zip(reqs, ks, props):
            sp = r.sampling
            finish = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(self.eos_token_ids))
            toks = toks[:k]
            for j, t in enumerate(toks):
                if t in finish:
                    toks = toks[:j]
                    break
            r.draft = toks
        return caught

    def update(self, req: Req, drafted: int, accepted: int) -> None:
        """After a verification (Drafts._accept_ngram): the request's counters and the accept histogram."""
        req.spec_draft_tokens += drafted
        req.spec_accepted_tokens += accepted
        self.accept_stats.add(accepted)
