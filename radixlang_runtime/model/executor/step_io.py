"""The runner's contract with whoever schedules it (torch-free): one ModelBatch in, one StepResult out.

The scheduler describes a step as a ModelBatch (plain data: which tokens run where, which requests
draw a token and with what parameters, which prompt positions want logprobs) and applies the
StepResult the runner returns (sampled tokens, accepted draft tokens, logprobs). model/ never sees
the scheduler's request or batch objects; finish decisions (stop ids, strings, lengths) stay with
the scheduler, which sees the tokens.

Indices: every per-request list is aligned with ModelBatch.table_rows (B requests); "request index"
in StepResult means a position in that list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from radixlang_runtime.protocol.sampling_params import SamplingParams


@dataclass
class SampleSpec:
    """One request that draws a token this step: what the grammar mask, the sampler and the verifier need.
    The lists are the request's own (read only here, never copied or edited)."""

    sampling: SamplingParams
    input_ids: list[int]  # the prompt (repetition penalty's scope, with output_ids)
    output_ids: list[int]  # tokens sampled so far (penalties, min_new_tokens, a seeded request's step)
    # Tokens to verify: the last len(draft) tokens of its extend ids. The request then owns len(draft) + 1
    # logits rows; row j is the distribution after draft[:j] (model/executor/sample_step.py).
    draft: list[int] = field(default_factory=list)
    # Constrained requests: the grammar state masking each of its rows (len(draft) + 1, or one state
    # used for every row); [] for unconstrained requests.
    grammar_states: list[Any] = field(default_factory=list)
    return_logprob: bool = False
    top_logprobs_num: int = 0
    forced: Optional[int] = None  # the token this sample must be (a spent thinking budget's end marker)
    also_allowed: Optional[int] = None  # a token its grammar mask lets through too (a reasoning block's opening)

    @property
    def constrained(self) -> bool:
        return bool(self.grammar_states)


@dataclass
class InputLogprobSpec:
    """A request whose prompt positions logprob_start_len .. L - 2 want next-token logprobs (executor/logprobs.py)."""

    prompt_ids: list[int]  # the whole prompt (L tokens)
    start: int  # logprob_start_len (< L)
    top_logprobs_num: int = 0


@dataclass
class PoolStep:
    """A pooling request's part of this step (pooling.PoolSpec): mean sums this step's rows; last and
    token_logits read the prompt's last position (final: it runs in this step); cls reads position 0."""

    mode: str  # pooling.POOL_MODES
    token_ids: tuple[int, ...] = ()  # token_logits: whose logits at the last position
    final: bool = True


@dataclass
class ModelBatch:
    """One forward pass as the scheduler plans it. B requests; per request aligned lists."""

    phase: str  # "extend" | "decode" | "mixed" (prefill whose tail, decode_from.., decodes in the same pass)
    rids: list[str]  # [B] (fault injection names requests by rid)
    table_rows: list[int]  # [B] rows of req_to_token
    prefix_lens: list[int]  # [B] positions already in the pool
    extend_ids: list[list[int]]  # [B] tokens to run (a decode step: exactly one each)
    out_locs: list[list[int]]  # [B] slots their K/V go to (same lengths as extend_ids)
    rewrites: list[tuple[int, list[int]]]  # (table row, slots of its cached prefix) written before the step
    samples: list[Optional[SampleSpec]]  # [B] None: no token drawn (a non-final prefill chunk, ...)
    input_logprobs: list[Optional[InputLogprobSpec]]  # [B] None: no prompt logprobs this step
    pools: list[Optional[PoolStep]] = field(default_factory=list)  # [B] or [] (no pooling request in the batch)
    lora_ids: list[int] = field(default_factory=list)  # [B] LoRA adapter ids (0: the base); []: all base
    # hybrid models' state snapshots: (snapshot slot, request slot) copied before the step; (request index,
    # offset in its extend ids, snapshot slot): the state after that many of its tokens is saved there
    state_loads: list[tuple[int, int]] = field(default_factory=list)
    state_saves: list[tuple[int, int, int]] = field(default_factory=list)
    hidden_states: list[bool] = field(default_factory=list)  # [B] return_hidden_states (executor/hidden_step.py)
    # [B] each request's ImageInputs (protocol/image_input.py): a prefill's placed (executor/image_step.py), every
    # row's positions counted past them under multimodal rope (executor/mrope.py); []: no request has one
    images: list[list[Any]] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return len(self.table_rows)

    @property
    def num_tokens(self) -> int:
        return sum(len(x) for x in self.extend_ids)


@dataclass
class StepLogprobs:
    """Logprobs one step produced for one request."""

    input_vals: list[float] = field(default_factory=list)  # next-token logprobs of this step's prompt positions
    input_top: list[list[list]] = field(default_factory=list)  # per position [[logprob, id], ...] (top_logprobs_num)
    input_ranks: list[int] = field(default_factory=list)  # per position: the prompt token's rank in the vocabulary
    output_val: Optional[float] = None  # logprob of the sampled token
    output_top: Optional[list[list]] = None
    # An n-gram draft's accepted tokens (unconstrained requests): the logprob of draft[j] at its row j, in order
    draft_vals: list[float] = field(default_factory=list)
    draft_top: list[list[list]] = field(default_factory=list)


@dataclass
class StepResult:
    """What one forward pass produced; the scheduler applies it (appends tokens, checks finishes)."""

    next_token_ids: list[int] = field(default_factory=list)  # one per request with a SampleSpec, in order
    accepted: dict[int, int] = field(default_factory=dict)  # request index -> draft tokens the model agreed with
    logprobs: dict[int, StepLogprobs] = field(default_factory=dict)  # request index -> its logprobs this step
    # request index -> its pooled part (executor/pooling_step.py): a hidden state (mean: the sum of this step's rows)
    # or token_logits' logits, float32 values as a list
    pooled: dict[int, list[float]] = field(default_factory=dict)
    # request index -> the final norm's output at each of its rows this step (return_hidden_states), float32
    hidden: dict[int, list[list[float]]] = field(default_factory=dict)
