"""--enable-deterministic-inference (model/executor/deterministic.py) on the real model in bf16: 24 mixed
greedy requests give the same tokens run one at a time, all in one batch, on a tight pool that
retracts (with small prefill chunks), and with the radix cache off. Then the refusals and the probe."""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPTS, assert_whole
from radixlang_kernels.cpu_caps import detect
from radixlang_runtime.model.layers.packed_linear import packing_available

pytestmark = pytest.mark.skipif(detect().compiler is None, reason="the mode needs the C kernels")
# bf16 linears are plain F.linear where oneDNN has no bf16 path (AVX2-only CPUs): the mode is refused there
needs_bf16_linears = pytest.mark.skipif(not packing_available(torch.device("cpu"), torch.bfloat16),
                                        reason="no oneDNN bf16 on this CPU: the mode is refused (tested below)")

SHOTS = ("Q: What is the capital of Italy?\nA: Rome.\nQ: What is the capital of Spain?\nA: Madrid.\n"
         "Q: What is the capital of Japan?\nA: Tokyo.\nQ: What is the capital of Canada?\nA: Ottawa.\n")
COUNTRIES = ["France", "Germany", "Peru", "Kenya", "Norway", "Chile", "Egypt", "India"]


def mixed_requests() -> list[tuple[str, int]]:
    """24 (prompt, max_new_tokens): few-shot prompts sharing a long prefix, chat prompts sharing the
    template, short plain prompts; lengths 3 .. 24 new tokens."""
    out = [(SHOTS + f"Q: What is the capital of {c}?\nA:", 6 + i) for i, c in enumerate(COUNTRIES[:4])]
    out += [(SHOTS * 2 + f"Q: Which language is spoken in {c}?\nA:", 12) for c in COUNTRIES[4:]]
    out += [(p, 8 + 4 * (i % 5)) for i, p in enumerate(PROMPTS[:5])]
    out += [(p + " and", 24 - i) for i, p in enumerate(PROMPTS[5:])]
    out += [(f"<|im_start|>user\nTell me one fact about {c}.<|im_end|>\n<|im_start|>assistant\n", 16)
            for c in COUNTRIES[::2]]
    out += [(f"{n} + {n} =", 3 + n % 4) for n in range(2)]
    assert len(out) == 24
    return out


def run(engine, reqs, one_at_a_time: bool) -> list[list[int]]:
    sps = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for _, n in reqs]
    prompts = [p for p, _ in reqs]
    if one_at_a_time:
        return [engine.generate(p, sp)["output_ids"] for p, sp in zip(prompts, sps)]
    return [o["output_ids"] for o in engine.generate(prompts, sps)]


@needs_bf16_linears
def test_same_tokens_alone_batched_retracted_and_uncached():
    from radixlang_runtime import Engine

    reqs = mixed_requests()
    det = dict(dtype="bfloat16", enable_deterministic_inference=True, debug_check_integrity=True)
    results = {}
    eng = Engine(max_total_tokens=8192, **det)
    try:
        assert eng.scheduler.runner.backend.rows_like_extend and not eng.scheduler.runner.backend.cascade
        results["alone"] = run(eng, reqs, one_at_a_time=True)  # later requests also hit the cache
        eng.flush_cache()
        results["batch"] = run(eng, reqs, one_at_a_time=False)
        assert_whole(eng)
    finally:
        eng.shutdown()
    # an optimistic decode reservation admits more than fits: decode must retract (16 pages; the largest
    # request needs 10: 384 tokens retracted nothing with these 24 requests, 256 retracted 11 times)
    eng = Engine(max_total_tokens=256, chunked_prefill_size=64, max_prefill_tokens=64, new_token_ratio_init=0.05,
                 new_token_ratio_min=0.05, **det)
    try:
        results["tight pool"] = run(eng, reqs, one_at_a_time=False)
        assert eng.scheduler.num_retracted_total > 0, "the pool was meant to force retractions"
        assert_whole(eng)
    finally:
        eng.shutdown()
    eng = Engine(max_total_tokens=8192, disable_radix_cache=True, **det)
    try:
        results["cache off"] = run(eng, reqs, one_at_a_time=False)
        assert_whole(eng)
    finally:
        eng.shutdown()
    want = results["alone"]
    assert [len(o) for o in want] == [n for _, n in reqs]
    for name, got in results.items():
        same = sum(a == b for a, b in zip(got, want))
        assert same == len(reqs), f"{name}: {same}/{len(reqs)} requests identical to the one-at-a-time run"


def test_refused_where_it_cannot_hold():
    from radixlang_runtime.server_args import ServerArgs

    for bad in (dict(quantization="int8"), dict(tp_size=2), dict(device="cuda")):
        with pytest.raises(ValueError, match="enable_deterministic_inference"):
            ServerArgs(enable_deterministic_inference=True, **bad)


def test_probe_catches_a_linear_whose_rows_depend_on_the_batch():
    from radixlang_runtime.model.executor import deterministic
    from radixlang_runtime.model.layers.packed_linear import PackedLinear, packing_available

    if not packing_available(torch.device("cpu"), torch.float32):
        pytest.skip("no oneDNN packing here")
    lin = PackedLinear(torch.randn(64, 48), None)
    assert deterministic.probe([lin], torch.float32) is None

    class BatchDependent(PackedLinear):
        def _run(self, x):  # rows pick up the batch mean: what a split-K GEMM choice can look like
            return super()._run(x) + 1e-3 * x.mean(0).sum()

    moved = deterministic.probe([BatchDependent(torch.randn(64, 48), None)], torch.float32)
    assert moved is not None and "64x48" in moved


def test_refused_without_the_c_kernels(monkeypatch):
    from radixlang_runtime.model.executor import deterministic
    from radixlang_kernels.cpu_ops import CpuPaths

    torch_paths = CpuPaths("torch:sdpa-gather", "torch:sdpa", "torch", "torch", "onednn:prepacked")
    with pytest.raises(ValueError, match="C attention / norm kernels"):
        deterministic.enable(torch.nn.Linear(2, 2), object(), torch_paths, torch.device("cpu"), torch.float32)
