"""The executor's prompt logprobs (executor/logprobs.py) on hand-made logits: each prompt token's value and
its rank (1 + the vocabulary entries with a strictly larger logprob; ties share the best rank), across
log_softmax chunks and a request that starts past a cached prefix."""

from __future__ import annotations

import torch

from radixlang_runtime.model.executor import logprobs as lp_mod
from radixlang_runtime.model.executor.step_io import InputLogprobSpec, ModelBatch, StepResult


def _batch(specs: list[InputLogprobSpec], prefix_lens: list[int], extend: list[list[int]]) -> ModelBatch:
    n = len(specs)
    return ModelBatch("extend", [f"r{i}" for i in range(n)], list(range(n)), prefix_lens, extend,
                      [list(range(len(e))) for e in extend], [], [None] * n, specs)


def _run(batch: ModelBatch, logits_of: dict[int, torch.Tensor]) -> StepResult:
    plans = lp_mod.plan_input_logprobs(batch)
    logits = torch.cat([logits_of[p.req_index][[r - sum(len(e) for e in batch.extend_ids[:p.req_index])
                                                 for r in p.rows]] for p in plans])
    result = StepResult()
    lp_mod.fill_input_logprobs(result, batch, plans, logits)
    return result


def test_ranks_count_strictly_larger_entries(monkeypatch):
    monkeypatch.setattr(lp_mod, "ROWS_PER_CHUNK", 2)  # three rows: two chunks
    vocab = 6
    prompt = [5, 1, 2, 3]  # rows 0..2 predict tokens 1, 2, 3
    logits = torch.tensor([[0.0, 4.0, 1.0, 1.0, 9.0, 2.0],    # token 1: one above it -> rank 2
                           [3.0, 3.0, 1.0, 3.0, 0.0, 0.5],    # token 2: three above it -> rank 4
                           [2.0, 5.0, 5.0, 5.0, 1.0, 0.0],    # token 3: tied at the top -> rank 1
                           [0.0] * vocab])                    # the last position predicts an output token
    batch = _batch([InputLogprobSpec(prompt, 0, 2)], [0], [prompt])
    out = _run(batch, {0: logits}).logprobs[0]
    assert out.input_ranks == [2, 4, 1]
    lsm = torch.log_softmax(logits[:3], dim=-1)
    assert out.input_vals == lsm[torch.arange(3), torch.tensor(prompt[1:])].tolist()
    brute = [1 + int((lsm[i] > lsm[i, t]).sum()) for i, t in enumerate(prompt[1:])]
    assert out.input_ranks == brute
    assert [t for _, t in out.input_top[0]] == [4, 1]  # (the other rows' tops are ties: any order)


def test_ranks_follow_a_cached_prefix_and_a_second_request():
    prompt = [0, 1, 2, 3, 0]
    rows = torch.tensor([[1.0, 2.0, 3.0, 4.0],     # position 2 predicts token 3: the top -> 1
                         [5.0, 4.0, 3.0, 2.0],     # position 3 predicts token 0: the top -> 1
                         [0.0, 0.0, 0.0, 0.0]])    # position 4: an output token
    other = [3, 2]
    orows = torch.tensor([[4.0, 3.0, 2.0, 1.0], [0.0, 0.0, 0.0, 0.0]])  # token 2 -> rank 3
    batch = _batch([InputLogprobSpec(prompt, 1, 0), InputLogprobSpec(other, 0, 0)], [2, 0], [prompt[2:], other])
    result = _run(batch, {0: rows, 1: orows})
    assert result.logprobs[0].input_ranks == [1, 1] and result.logprobs[0].input_top == []
    assert result.logprobs[1].input_ranks == [3]
