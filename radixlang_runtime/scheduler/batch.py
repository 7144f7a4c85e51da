"""What one forward step runs (torch-free): the runner turns it into tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from radixlang_runtime.scheduler.request import Req

# "mixed" (--enable-mixed-chunk): a prefill batch whose tail, reqs[decode_from:], are running requests
# taking their next decode step inside the same forward pass (each an extend of one token).
Phase = Literal["extend", "decode", "mixed"]


@dataclass
class StepLogprobs:
    """Logprobs one step produced for one request (filled by the runner)."""

    input_vals: list[float] = field(default_factory=list)  # next-token logprobs of this step's prompt positions
    input_top: list[list[list]] = field(default_factory=list)  # per position [[logprob, id], ...] (top_logprobs_num)
    output_val: Optional[float] = None  # logprob of the sampled token
    output_top: Optional[list[list]] = None
    # An n-gram draft's accepted tokens (unconstrained requests): the logprob of draft[j] at its row j, in order
    draft_vals: list[float] = field(default_factory=list)
    draft_top: list[list[list]] = field(default_factory=list)


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
    # the last draft_lens[i] tokens of extend_ids[i]. The runner verifies them (model/sample_step.py).
    draft_lens: list[int] = field(default_factory=list)
    # Filled by the runner:
    next_token_ids: list[int] = field(default_factory=list)
    logprobs: dict[int, StepLogprobs] = field(default_factory=dict)  # request index -> its logprobs this step
    accepted: dict[int, int] = field(default_factory=dict)  # request index -> draft tokens the model agreed with

    def __post_init__(self) -> None:
        if self.decode_from < 0:
            self.decode_from = 0 if self.phase == "decode" else len(self.reqs)

    @property
    def batch_size(self) -> int:
        return len(self.reqs)

    @property
    def num_tokens(self) -> int:
        return sum(len(x) for x in self.extend_ids)
