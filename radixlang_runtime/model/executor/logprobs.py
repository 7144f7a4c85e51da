"""Logprobs of prompt and sampled tokens: raw log_softmax of the model's logits.

"Raw": before penalties, temperature, top-k/p or EOS suppression, i.e. the model's own distribution
(temperature-independent, comparable across requests and with transformers' logits).

Positions: logit position i predicts token i + 1. A request asks for positions logprob_start_len ..
L - 2 of its prompt (L = prompt length); position L - 1 predicts the first output token, which is an
output logprob. With chunked prefill a step covers only some of those positions.

A prompt token's rank is 1 + the number of vocabulary entries with a strictly larger logprob at its
position (1: the model's top choice; ties share the best rank), as vLLM's prompt_logprobs report it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlang_runtime.model.executor.step_io import ModelBatch, StepLogprobs, StepResult

ROWS_PER_CHUNK = 256  # log_softmax over [rows, vocab] in pieces: 256 x 49152 float32 = 48 MiB


@dataclass
class InputLogprobPlan:
    req_index: int
    rows: list[int]  # rows of the step's flattened tokens whose logits are needed
    targets: list[int]  # the token each row predicts


def plan_input_logprobs(batch: ModelBatch) -> list[InputLogprobPlan]:
    plans = []
    start = 0
    for i, (spec, p, ids) in enumerate(zip(batch.input_logprobs, batch.prefix_lens, batch.extend_ids)):
        n = len(ids)
        if spec is not None:
            L = len(spec.prompt_ids)
            lo, hi = max(p, spec.start), min(p + n - 1, L - 2)
            if lo <= hi:
                plans.append(InputLogprobPlan(i, list(range(start + lo - p, start + hi - p + 1)),
                                              spec.prompt_ids[lo + 1 : hi + 2]))
        start += n
    return plans


def _top(lsm: torch.Tensor, k: int) -> list[list[list]]:
    vals, ids = lsm.topk(k, dim=-1)
    return [[[v, t] for v, t in zip(vr, ir)] for vr, ir in zip(vals.tolist(), ids.tolist())]


def fill_input_logprobs(result: StepResult, batch: ModelBatch, plans: list[InputLogprobPlan],
                        logits: torch.Tensor) -> None:
    """logits [sum of plan rows, V], in plan order."""
    off = 0
    for plan in plans:
        k = batch.input_logprobs[plan.req_index].top_logprobs_num
        out = result.logprobs.setdefault(plan.req_index, StepLogprobs())
        targets = torch.tensor(plan.targets, dtype=torch.int64, device=logits.device)
        for a in range(0, len(plan.rows), ROWS_PER_CHUNK):
            b = min(a + ROWS_PER_CHUNK, len(plan.rows))
            lsm = torch.log_softmax(logits[off + a : off + b], dim=-1)  # [r, V]
            picked = lsm.gather(1, targets[a:b, None])  # [r, 1]
            out.input_vals += picked.squeeze(1).tolist()
            out.input_ranks += ((lsm > picked).sum(dim=-1) + 1).tolist()
            if k:
                out.input_top += _top(lsm, k)
        off += len(plan.rows)


def fill_output_logprobs(result: StepResult, batch: ModelBatch, sample_idx: list[int], want: list[int],
                         lsm: torch.Tensor, next_ids: list[int]) -> None:
    """lsm [len(want), V]: the picked row of each sampled request sample_idx[j], j in want."""
    if not want:
        return
    chosen = torch.tensor([next_ids[j] for j in want], dtype=torch.int64, device=lsm.device)
    vals = lsm.gather(1, chosen[:, None]).squeeze(1).tolist()
    for row, (j, v) in enumerate(zip(want, vals)):
        i = sample_idx[j]
        out = result.logprobs.setdefault(i, StepLogprobs())
        out.output_val = v
        k = batch.samples[i].top_logprobs_num
        if k:
            out.output_top = _top(lsm[row : row + 1], k)[0]
