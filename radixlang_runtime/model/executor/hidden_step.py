"""return_hidden_states' part of a step (SGLang's field): the final norm's output (what the head reads) at every
row a requesting request runs this step: its prompt's positions in its prefill chunks, its decode input after.
They ride on the hidden-row path pooling uses (StepInputs.hidden_rows), after pooling's rows; the scheduler keeps
them by position (scheduler/hidden_states.py). No figures here: the values are the model's float32 rows."""

from __future__ import annotations

import torch

from radixlang_runtime.model.executor.step_io import ModelBatch, StepResult


def plan_hidden(batch: ModelBatch, ends: list[int]) -> list[tuple[int, int, int]]:
    """(request index, first flattened row, rows) of each request asking for hidden states ([] when none)."""
    return [(i, ends[i] - len(batch.extend_ids[i]), len(batch.extend_ids[i]))
            for i, on in enumerate(batch.hidden_states) if on]


def hidden_rows(plan: list[tuple[int, int, int]]) -> list[int]:
    return [r for _, start, n in plan for r in range(start, start + n)]


def fill_hidden(result: StepResult, plan: list[tuple[int, int, int]], hidden: torch.Tensor) -> None:
    """hidden [sum of the plan's rows, hidden size] float32, in the plan's order."""
    off = 0
    for i, _, n in plan:
        result.hidden[i] = hidden[off:off + n].tolist()
        off += n
