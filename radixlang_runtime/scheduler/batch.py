"""What one forward step runs (torch-free), in the scheduler's terms; `model_batch()` is the runner's view of it
(model/step_io.ModelBatch: plain data, no Req objects), the runner's StepResult comes back to the scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from radixlang_runtime.model.executor.step_io import InputLogprobSpec, ModelBatch, PoolStep, SampleSpec
from radixlang_runtime.scheduler.request import Req, future_token

# "mixed" (--enable-mixed-chunk): a prefill batch whose tail, reqs[decode_from:], are running requests
# taking their next decode step inside the same forward pass (each an extend of one token).
Phase = Literal["extend", "decode", "mixed"]


@dataclass
class ScheduleBatch:
    phase: Phase
    reqs: list[Req]
    # Per request, aligned with reqs:
    prefix_lens: list[int]  # kv_len before this step (positions already in the pool)
    extend_ids: list[list[int]]  # tokens to run; a decode step runs exactly one per request
    out_locs: list[list[int]]  # slots where this step stores their K/V (same lengths as extend_ids)
    sample: list[bool]  # False for a non-final prefill chunk (or max_new_tokens == 0): no token is drawn
    # Requests (indices into reqs) whose table row must be rewritten before the step:
    # req_to_token[row, :prefix_len] = req.kv_indices[:prefix_len] (a cache match, or slots swapped for the tree's).
    rewrite_rows: list[int] = field(default_factory=list)
    decode_from: int = -1  # first decoding request (0 for "decode", len(reqs) for "extend"); set in __post_init__
    # Jump-forward drafts riding in this step (aligned with reqs; empty: none): reqs[i].draft's length,
    # the last draft_lens[i] tokens of extend_ids[i]. The runner verifies them (model/executor/sample_step.py).
    draft_lens: list[int] = field(default_factory=list)
    # hybrid models (scheduler/state_cache.py): snapshot -> request state slot copies before the step, and
    # (request index, offset in its extend, snapshot slot) states saved during it
    state_loads: list[tuple[int, int]] = field(default_factory=list)
    state_saves: list[tuple[int, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.decode_from < 0:
            self.decode_from = 0 if self.phase == "decode" else len(self.reqs)

    @property
    def batch_size(self) -> int:
        return len(self.reqs)

    @property
    def num_tokens(self) -> int:
        return sum(len(x) for x in self.extend_ids)

    def model_batch(self) -> ModelBatch:
        """The runner's input: tokens, slots, table rewrites, and per request what sampling and logprobs need."""
        rewrites = []
        for i in self.rewrite_rows:
            req, p = self.reqs[i], self.prefix_lens[i]
            if p:
                rewrites.append((req.table_idx, req.kv_indices[:p]))  # a slice: already a copy
        return ModelBatch(
            phase=self.phase, rids=[r.rid for r in self.reqs], table_rows=[r.table_idx for r in self.reqs],
            prefix_lens=self.prefix_lens, extend_ids=self.extend_ids, out_locs=self.out_locs, rewrites=rewrites,
            samples=[self._sample_spec(i) if s else None for i, s in enumerate(self.sample)],
            input_logprobs=[InputLogprobSpec(r.input_ids, r.logprob_start_len, r.top_logprobs_num)
                            if i < self.decode_from and r.wants_input_logprobs else None
                            for i, r in enumerate(self.reqs)],
            pools=self._pool_steps() if self.decode_from and any(r.pooled is not None for r in self.reqs) else [],
            lora_ids=[r.lora_id for r in self.reqs] if any(r.lora_id for r in self.reqs) else [],
            state_loads=self.state_loads, state_saves=self.state_saves,
            hidden_states=[r.return_hidden_states for r in self.reqs]
            if any(r.return_hidden_states for r in self.reqs) else [],
            images=[r.images for r in self.reqs] if any(r.images for r in self.reqs) else [])

    def _pool_steps(self) -> list:
        """Each pooling request's PoolStep (final: its prompt's last position runs in this step)."""
        return [PoolStep(r.pooled.spec.mode, r.pooled.spec.token_ids, p + len(x) == len(r.input_ids))
                if r.pooled is not None and i < self.decode_from else None
                for i, (r, p, x) in enumerate(zip(self.reqs, self.prefix_lens, self.extend_ids))]

    def _sample_spec(self, i: int) -> SampleSpec:
        req = self.reqs[i]
        draft = req.draft if self.draft_lens and self.draft_lens[i] else []
        states = [] if req.grammar is None else list(req.draft_states) if req.draft_states else [req.grammar]
        # a token a step in flight samples: a copy ending in its placeholder, which the forward thread fills in
        out = req.output_ids if req.future is None else req.output_ids + [future_token(req.future[1])]
        forced = also = None
        if req.watch is not None and req.future is None:  # a watched request never overlaps (overlap.py)
            forced = req.watch.forced(req.output_ids)
            also = req.watch.also_allowed(req.output_ids) if states else None
        return SampleSpec(req.sampling, req.input_ids, out, draft, states, req.return_logprob, req.top_logprobs_num,
                          forced, also)
