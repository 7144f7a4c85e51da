"""return_hidden_states' bookkeeping (scheduler/hidden_states.py, model/executor/hidden_step.py, output_args.py):
rows kept by position across chunks, a rerun after retraction and a verified draft's rejected tokens; the output
in SGLang's shape; the step's rows planned per requesting request; settings it is not served with refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixlang_runtime.model.executor.hidden_step import fill_hidden, hidden_rows, plan_hidden
from radixlang_runtime.model.executor.step_io import ModelBatch, StepResult
from radixlang_runtime.protocol.sampling_params import SamplingParams
from radixlang_runtime.scheduler.batch import ScheduleBatch
from radixlang_runtime.scheduler.hidden_states import hidden_states_out, keep_hidden
from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.server_args import ServerArgs
from scheduler_utils import assert_whole, drain, make, req


def row(p: int) -> list[float]:
    return [float(p), -float(p)]  # a row that names its position


def rows(start: int, n: int) -> list[list[float]]:
    return [row(p) for p in range(start, start + n)]


def step(req: Req, prefix: int, extend: list[int], draft: int = 0, accepted: int = 0) -> None:
    batch = ScheduleBatch("mixed" if draft else "extend", [req], [prefix], [extend], [[0] * len(extend)], [True],
                          draft_lens=[draft] if draft else [])
    keep_hidden(req, batch, 0, StepResult(accepted={0: accepted}, hidden={0: rows(prefix, len(extend))}))


def test_rows_are_kept_by_position():
    req = Req("r", list(range(10, 20)), SamplingParams(max_new_tokens=8), return_hidden_states=True)
    step(req, 0, req.input_ids[:6])  # a first chunk
    step(req, 6, req.input_ids[6:])  # the last chunk
    req.output_ids = [1]
    step(req, 10, [1])  # a decode step
    assert req.hidden_rows == rows(0, 11)
    step(req, 0, req.input_ids + [1])  # recomputed after a retraction: nothing twice
    assert req.hidden_rows == rows(0, 11)
    req.output_ids = [1, 2]
    step(req, 11, [2, 7, 8, 9], draft=3, accepted=1)  # a draft of 3, one token taken: 7's row stays, 8's and 9's go
    assert req.hidden_rows == rows(0, 13)


def test_the_output_is_sglangs_shape():
    req = Req("r", [5, 6, 7], SamplingParams(max_new_tokens=3), return_hidden_states=True)
    req.output_ids, req.hidden_rows = [1, 2, 3], rows(0, 6)  # a step in flight ran the last token too
    assert hidden_states_out(req) == [rows(0, 3), row(3), row(4)]
    req.output_ids = [1]
    assert hidden_states_out(req) == [rows(0, 3)]
    assert hidden_states_out(Req("q", [5], SamplingParams(max_new_tokens=1))) is None


def test_the_step_plans_rows_of_requesting_requests_only():
    batch = ModelBatch("extend", ["a", "b", "c"], [0, 1, 2], [0, 0, 4], [[1, 2], [3, 4, 5], [6]],
                       [[0, 1], [2, 3, 4], [5]], [], [None] * 3, [None] * 3, hidden_states=[True, False, True])
    plan = plan_hidden(batch, [2, 5, 6])
    assert plan == [(0, 0, 2), (2, 5, 1)] and hidden_rows(plan) == [0, 1, 5]
    result = StepResult()
    fill_hidden(result, plan, torch.tensor([row(0), row(1), row(5)]))
    assert result.hidden == {0: [row(0), row(1)], 2: [row(5)]}


@pytest.mark.parametrize("kwargs,needle", [
    ({"speculative_algorithm": "NGRAM"}, "speculative_algorithm"),
    ({"disaggregation_mode": "prefill"}, "disaggregation_mode"),
    ({"is_embedding": True}, "is_embedding"),
])
def test_settings_it_is_not_served_with_are_refused(kwargs, needle):
    with pytest.raises(ValueError, match=f"enable_return_hidden_states with {needle}"):
        ServerArgs(enable_return_hidden_states=True, **kwargs)
    ServerArgs(**kwargs)  # fine without the flag


@pytest.mark.parametrize("asks", [False, True])
def test_a_burst_sharing_a_prefix_waits_a_round_only_when_the_cache_serves_it(asks):
    """Without hidden states the sharers wait for the first one's prefix (then read it from the cache); a request
    returning hidden states computes its whole prompt anyway, so it is admitted at once and reads nothing."""
    sched, _ = make(page_size=16, max_prefill=4096)
    prefix = req("p", 40, 0).input_ids
    reqs = []
    for i in range(3):
        r = req(f"s{i}", 10, 2, seed=i + 1)
        reqs.append(dataclasses.replace(r, input_ids=prefix + r.input_ids, return_hidden_states=asks))
    for r in reqs:
        sched.add_request(r)
    sched.step()
    assert [r.admitted_at is not None for r in reqs] == [True, asks, asks]
    drain(sched)
    assert [r.cached_len for r in reqs] == ([0, 0, 0] if asks else [0, 32, 32])
    assert_whole(sched)
