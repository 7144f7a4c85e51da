"""`--lora-backend triton`: the LoRA deltas through the Triton segment kernels (model/layers/lora_triton.py over
kernels/radixlang_kernels/lora_sgmv.py; interpreted on CPU, TRITON_INTERPRET=1 set by conftest where there is no
GPU). A LoraLinear with two adapters (one without deltas on it) over interleaved rows equals each row's merged
linear; an Engine on a tiny random Llama with two peft adapters runs the base and both adapters in one batch
and equals the csgmv backend and transformers + peft merged, float32, token for token."""

from __future__ import annotations

import pytest
from lora_adapters import ADAPTERS, OTHER, PROMPT, SP, build_base_and_adapters, record_steps

pytest.importorskip("triton")


def test_lora_linear_through_triton_equals_merged_weights():
    import torch
    from torch import nn

    from radixlang_runtime.model.layers.lora_linear import LoraLinear, LoraState

    torch.manual_seed(0)
    base, state = nn.Linear(8, 12, bias=False), LoraState(backend="triton")
    lin = LoraLinear(base, {"q_proj": (0, 4), "k_proj": (4, 4), "v_proj": (8, 4)}, state)
    a = {(i, p): torch.randn(r, 8) for i, r in ((1, 2), (2, 3)) for p in ("q_proj", "v_proj")}
    b = {(i, p): torch.randn(4, a[i, p].shape[0]) for i, p in a}
    for (i, p) in a:
        lin.add(i, p, a[i, p], b[i, p])
    ids, counts = [1, 0, 2, 3, 1], [2, 3, 1, 1, 2]  # adapter 3 has no deltas on this linear
    x = torch.randn(sum(counts), 8)
    state.set_rows(ids, counts, x.device)
    assert state.segments is not None and state.segments.lora_ids == (1, 2, 3)
    with torch.no_grad():
        y = lin(x)
    rows = [i for i, n in zip(ids, counts) for _ in range(n)]
    for r, lid in enumerate(rows):
        w = base.weight.detach().clone()
        for p, off in (("q_proj", 0), ("v_proj", 8)):
            if (lid, p) in a:
                w[off:off + 4] += b[lid, p] @ a[lid, p]
        torch.testing.assert_close(y[r], x[r] @ w.t(), rtol=1e-5, atol=1e-5)


def test_triton_backend_mixed_batch_equals_csgmv_and_peft(tmp_path_factory):
    from radixlang_runtime import Engine

    root = tmp_path_factory.mktemp("lora_triton")
    want = build_base_and_adapters(root)
    assert len({tuple(want[n][tuple(PROMPT)]) for n in ("", "alpha", "beta")}) == 3  # the comparison can fail
    names = [None, "alpha", "beta", "alpha", None, "beta"]
    prompts = [PROMPT, PROMPT, PROMPT, OTHER, OTHER, OTHER]
    outs = {}
    for backend in ("csgmv", "triton"):
        with Engine(str(root / "base"), dtype="float32", max_total_tokens=1024, lora_backend=backend,
                    lora_paths=[f"{n}={root / n}" for n in ADAPTERS], max_loras_per_batch=4) as eng:
            seen = record_steps(eng)
            outs[backend] = [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params=SP,
                                                                   lora_path=names)]
            assert any(set(ids) == {0, 1, 2} for ids in seen), seen  # base and both adapters in one pass
            if backend == "triton":
                kernels = {type(m.kernel).__name__ for m in eng.runner.model.modules() if hasattr(m, "kernel")}
                assert kernels == {"TritonLoraWeights"}
            eng.check_integrity()
    assert outs["triton"] == outs["csgmv"] == [want["" if n is None else n][tuple(p)] for n, p in zip(names, prompts)]


def test_triton_backend_on_cpu_needs_the_interpreter(monkeypatch):
    import torch

    from radixlang_runtime.model.layers.lora_triton import triton_lora_ready

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "TRITON_INTERPRET=1" in triton_lora_ready(torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_lora_ready(torch.device("cpu")) == ""
