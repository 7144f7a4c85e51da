"""Pooling requests in a step (ModelBatch.pools, step_io.PoolStep): which rows they read and what they return.

Hidden modes read final hidden states (the model's final_hidden, the head's input): mean sums every row this
step runs (the scheduler adds the chunks' sums and divides at the end: pooling.PooledSum), last the prompt's
last row, cls position 0's row. token_logits (rerankers) reads the logits of a few tokens at the prompt's last
row: that row joins the step's logit rows, so the head runs on it exactly as for a sampled token. classify
(sequence classifiers) reads the last row's hidden state and runs the model's score head on it.
A step without pooling requests never comes here (the runner's plain path).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from radixlang_runtime.model.executor.step_io import ModelBatch, StepResult


@dataclass
class PoolPlan:
    hidden_rows: list[int] = field(default_factory=list)  # [P] flattened token rows whose hidden states are read
    logit_rows: list[int] = field(default_factory=list)  # [L] token_logits requests' last rows
    # (request index, offset into hidden_rows, row count, mode): mean sums its rows, the others take one
    segments: list[tuple[int, int, int, str]] = field(default_factory=list)
    logit_reqs: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)  # (request index, token ids)


def plan_pooling(batch: ModelBatch, ends: list[int]) -> PoolPlan:
    """ends: each request's end row in the flattened tokens (cumulative extend lengths)."""
    plan = PoolPlan()
    for i, p in enumerate(batch.pools):
        if p is None:
            continue
        n = len(batch.extend_ids[i])
        start, end = ends[i] - n, ends[i]
        if p.mode == "token_logits":
            if p.final:
                plan.logit_rows.append(end - 1)
                plan.logit_reqs.append((i, p.token_ids))
            continue
        if p.mode == "mean":
            rows = list(range(start, end))
        elif p.mode == "cls":
            rows = [start] if batch.prefix_lens[i] == 0 else []
        else:  # last, classify
            rows = [end - 1] if p.final else []
        if rows:
            plan.segments.append((i, len(plan.hidden_rows), len(rows), p.mode))
            plan.hidden_rows += rows
    return plan


def fill_pooled(result: StepResult, plan: PoolPlan, hidden: torch.Tensor, logits: torch.Tensor,
                classify: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> None:
    """hidden [P, hidden] (plan.hidden_rows), logits [L, V] (plan.logit_rows), both float32; classify: the
    model's score head ([R, hidden] -> [R, num_labels]), for classify requests."""
    for i, off, n, mode in plan.segments:
        part = hidden[off:off + n]  # [n, hidden]
        if mode == "classify":
            if classify is None:
                raise ValueError("pooling mode classify needs a sequence classifier (a model with a score head)")
            result.pooled[i] = classify(part[:1])[0].tolist()  # [num_labels]
        else:
            result.pooled[i] = (part.double().sum(0) if mode == "mean" else part[0]).tolist()
    for j, (i, ids) in enumerate(plan.logit_reqs):
        result.pooled[i] = logits[j, torch.tensor(ids, dtype=torch.int64, device=logits.device)].tolist()
