"""StepInputs: one forward pass as plain data, planned on the scheduler's rank from its ModelBatch: all any rank
needs to run the model (tensor parallel: rank 0 broadcasts it, model/executor/parallel.py)."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

from radixlang_runtime.model.executor.step_io import ModelBatch


@dataclass
class StepInputs:
    """One forward pass, as plain data (what rank 0 broadcasts). B requests, T = sum(extend_lens) tokens."""

    phase: str  # "extend" | "decode"
    input_ids: list[int]  # [T]
    out_loc: list[int]  # [T] slots the new K/V go to
    req_rows: list[int]  # [B] rows of req_to_token
    prefix_lens: list[int]  # [B]
    extend_lens: list[int]  # [B]
    rewrites: list[tuple[int, list[int]]]  # (table row, slots of its cached prefix) to write first
    logit_rows: list[int]  # [R] flattened token rows the head runs on
    hidden_rows: list[int] = field(default_factory=list)  # [P] rows whose final hidden states pooling reads
    lora_ids: list[int] = dataclasses.field(default_factory=list)  # [B] adapter ids (0: base); []: all base
    state_loads: list[tuple[int, int]] = field(default_factory=list)  # hybrid models: ModelBatch.state_loads
    state_saves: list[tuple[int, int, int]] = field(default_factory=list)  # ModelBatch.state_saves
    state_verify: list[int] = field(default_factory=list)  # hybrid: requests verifying a draft (verify_step.py)
    images: list[Any] = field(default_factory=list)  # prefilled images' rows (executor/image_step.ImageRows)
    mrope: list[list[int]] = field(default_factory=list)  # [3][T] multimodal rope positions (executor/mrope.py)


def step_inputs(batch: ModelBatch, logit_rows: list[int]) -> StepInputs:
    return StepInputs(
        phase="decode" if batch.phase == "decode" else "extend",
        input_ids=list(itertools.chain.from_iterable(batch.extend_ids)),
        out_loc=list(itertools.chain.from_iterable(batch.out_locs)),
        req_rows=list(batch.table_rows), prefix_lens=list(batch.prefix_lens),
        extend_lens=[len(x) for x in batch.extend_ids], rewrites=batch.rewrites, logit_rows=logit_rows,
        lora_ids=list(batch.lora_ids) if any(batch.lora_ids) else [],
        state_loads=list(batch.state_loads), state_saves=list(batch.state_saves))
