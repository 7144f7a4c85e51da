"""Pooling requests through the scheduler with a fake runner (no torch): prefill-only, the chunks' sums of mean
pooling added and divided once, the prefix cache used by last-token pooling and bypassed by mean / CLS, generation
requests in the same batches unchanged; the KV allocator whole after every step (debug_check_integrity)."""

from __future__ import annotations

from fakes import FakeRunner, expected_output
from radixlang_runtime.model.executor.step_io import ModelBatch, StepResult
from radixlang_runtime.pooling import PooledSum, PoolSpec
from radixlang_runtime.protocol.sampling_params import SamplingParams
from radixlang_runtime.scheduler.request import Req
from scheduler_utils import make, req


class PoolingFakeRunner(FakeRunner):
    """FakeRunner plus pooled parts: a token's 'hidden state' is [id, 2 * id]; token_logits returns the ids."""

    def forward(self, batch: ModelBatch) -> StepResult:
        result = super().forward(batch)
        for i, p in enumerate(batch.pools):
            ids = batch.extend_ids[i]
            if p is None:
                continue
            if p.mode == "mean":
                result.pooled[i] = [float(sum(ids)), 2.0 * sum(ids)]
            elif p.mode == "cls" and batch.prefix_lens[i] == 0:
                result.pooled[i] = [float(ids[0]), 2.0 * ids[0]]
            elif p.mode == "last" and p.final:
                result.pooled[i] = [float(ids[-1]), 2.0 * ids[-1]]
            elif p.mode == "token_logits" and p.final:
                result.pooled[i] = [float(t) for t in p.token_ids]
        return result


def _pooling_req(rid: str, ids: list[int], spec: PoolSpec) -> Req:
    return Req(rid=rid, input_ids=list(ids), sampling=SamplingParams.from_dict({"max_new_tokens": 0}),
               pooled=PooledSum(spec))


def _run(sched, reqs: list[Req], max_steps: int = 200) -> int:
    for r in reqs:
        sched.add_request(r)
    steps = 0
    while not sched.is_idle:
        sched.step()
        steps += 1
        assert steps < max_steps
    return steps


def _sched(**kw):
    sched, _ = make(page_size=4, chunk=16, **kw)
    sched.runner = runner = PoolingFakeRunner()
    return sched, runner


def test_mean_over_chunks_cls_and_last():
    sched, runner = _sched()
    ids = list(range(1, 51))  # 50 tokens: 4 chunks of 16
    mean, cls, last = (_pooling_req(m, ids, PoolSpec(m)) for m in ("mean", "cls", "last"))
    _run(sched, [mean])
    _run(sched, [cls, last])
    assert mean.pooled.result() == [25.5, 51.0]
    assert cls.pooled.result() == [1.0, 2.0] and last.pooled.result() == [50.0, 100.0]
    assert [r.finished_reason["type"] for r in (mean, cls, last)] == ["length"] * 3
    assert mean.output_ids == [] and cls.cached_len == 0 and last.cached_len > 0  # cls recomputed, last reused


def test_mean_computes_every_position_again():
    sched, runner = _sched()
    ids = list(range(3, 40))
    first, again = _pooling_req("a", ids, PoolSpec("mean")), _pooling_req("b", ids, PoolSpec("mean"))
    _run(sched, [first])
    before = sched.admission.prefill_tokens_computed
    _run(sched, [again])
    assert sched.admission.prefill_tokens_computed - before == len(ids) and again.cached_len == 0
    assert again.pooled.result() == first.pooled.result() == [sum(ids) / len(ids), 2 * sum(ids) / len(ids)]


def test_generation_beside_pooling_is_unchanged():
    sched, _ = _sched()
    gen = req("g", 20, 6)
    pools = [_pooling_req(f"p{i}", [10 + i, 20 + i, 30 + i], PoolSpec("token_logits", (7, 9))) for i in range(3)]
    _run(sched, [gen, *pools])
    assert gen.output_ids == expected_output(gen.input_ids, 6)
    assert [p.pooled.result() for p in pools] == [[7.0, 9.0]] * 3
    assert sched.kv.allocator.available_size() + sched.kv.cached_size() == sched.kv.allocator.total_slots


def test_inputs_queued_together_run_as_one_batch():
    sched, runner = _sched()
    reqs = [_pooling_req(f"p{i}", [40 + i, 50 + i, 60 + i, 70 + i], PoolSpec("last")) for i in range(8)]
    assert _run(sched, reqs) == 1 and runner.batches == [("extend", 8, 32)]
