"""model/executor/fused_decode.py: decode-sized steps through decode_layer.c give bit-identical logits and K/V to
the module path, for every weight kind it takes (bf16 / float32 dense tiles, GGUF blocks and q8 tiles, int8), on the
embedded model, with and without cascade groups; steps it must not take (larger batches) run the modules."""

from __future__ import annotations

import pytest
import torch

from radixlang_kernels.cpu_caps import detect
from radixlang_runtime.model.executor.runner import StepInputs
from runner_steps import decode_scenario

pytestmark = pytest.mark.skipif(detect().compiler is None, reason="no C compiler: no fused decode")

PROMPTS = [[(i * 37 + 11) % 40000 + 100 for i in range(n)] for n in (5, 23, 9)]


def _scenario(runner, row0: int, slot0: int, shared: int = 0):
    return decode_scenario(runner, PROMPTS, row0, slot0, shared=shared)


KINDS = {"bf16": dict(dtype="bfloat16"), "fp32": dict(dtype="float32"),
         "gguf": dict(dtype="bfloat16", quantization="gguf"), "gguf-fp32": dict(dtype="float32", quantization="gguf"),
         "int8": dict(dtype="bfloat16", quantization="int8")}


@pytest.fixture(scope="module", params=list(KINDS))
def kind_engine(request):
    """One engine per weight kind, shared by its cases (each case prefills rows and slots of its own)."""
    from radixlang_runtime import Engine
    from radixlang_runtime.model.layers.packed_linear import packing_available

    kw = KINDS[request.param]
    if kw == dict(dtype="bfloat16") and not packing_available(torch.device("cpu"), torch.bfloat16):
        pytest.skip("bf16 dense linears are plain F.linear on this CPU (no oneDNN bf16): no decode kernel to fuse")
    with Engine(None, max_total_tokens=2048, **kw) as eng:
        yield eng


@pytest.mark.parametrize("shared", [0, 100], ids=["own", "cascade"])
def test_fused_decode_is_bit_identical_to_the_modules(kind_engine, shared):
    runner = kind_engine.runner
    model = runner.model
    fused = model.fused_decode
    assert fused is not None, runner.cpu_paths
    assert runner.cpu_paths.decode_layer.startswith("c:")
    calls = []
    run = fused.run
    fused.run = lambda residual, fb: (calls.append((fb.batch_size, fb.attn_meta.cascade is not None)),
                                      run(residual, fb))[1]
    try:
        with torch.inference_mode():
            got, got_kv = _scenario(runner, 0, 0, shared=shared)
            assert calls == [(3, shared > 0)] * 4  # every decode step (with cascade groups or not), no prefill
            model.fused_decode = None
            want, want_kv = _scenario(runner, 3, 1000, shared=shared)
    finally:
        model.fused_decode = fused
        del fused.run  # the bound method again
    for step, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"step {step}: max diff {(a - b).abs().max().item()}"
    assert torch.equal(got_kv, want_kv)


def test_fused_decode_takes_cascade_groups_and_steps_aside_for_large_batches():
    from radixlang_runtime import Engine

    with Engine(None, max_total_tokens=4096) as eng:
        runner = eng.runner
        fused = runner.model.fused_decode
        assert fused is not None
        seen = []
        applies = fused.applies
        fused.applies = lambda fb: (seen.append((fb.batch_size, applies(fb))), seen[-1][1])[1]
        shared = list(range(500, 600))  # 100 shared positions: cascade groups them (MIN_SHARED = 64)
        with torch.inference_mode():
            runner.run_step(StepInputs("extend", shared, list(range(100)), [0], [0], [100], [], [99]))
            rows = [0, 1, 2]
            for r in (1, 2):  # the same cached slots in two more rows, one new token each
                runner.kv_pool.req_to_token[r, :100] = torch.arange(100)
            runner.run_step(StepInputs("decode", [7, 8, 9], [100, 101, 102], rows, [100] * 3, [1] * 3, [], [0, 1, 2]))
            fused.max_batch = 8  # (256 on VDPBF16PS builds: more rows than the table has)
            n = fused.max_batch + 1
            runner.run_step(StepInputs("extend", [5] * n, list(range(200, 200 + n)), list(range(3, 3 + n)), [0] * n,
                                       [1] * n, [], list(range(n))))
            runner.run_step(StepInputs("decode", [6] * n, list(range(300, 300 + n)), list(range(3, 3 + n)), [1] * n,
                                       [1] * n, [], list(range(n))))
        assert (3, True) in seen  # cascade groups: decode_layer.c runs the shared-prefix attention too
        assert (n, False) in seen  # above the decode kernels' batch size


@pytest.mark.parametrize("shared", [0, 100], ids=["own", "cascade"])
def test_fused_decode_sliding_window_layers_are_bit_identical(shared):
    """Alternating windowed (16 positions) and full layers: decode_layer.c reads a windowed layer's last 16
    positions (no cascade groups there), as the module path does; the full layers keep the groups."""
    from radixlang_runtime import Engine
    from radixlang_runtime.model.executor.fused_decode import FusedDecode

    with Engine(None, max_total_tokens=2048, dtype="float32") as eng:
        runner = eng.runner
        model = runner.model
        n = len(model.layers)
        runner.backend.set_layer_options(tuple(16 if i % 2 == 0 else 0 for i in range(n)))
        fused = model.fused_decode = FusedDecode.build(model, torch.float32)
        assert fused is not None and [w.window for w in fused.weights][:2] == [16, 0]
        with torch.inference_mode():
            got, got_kv = _scenario(runner, 0, 0, shared=shared)
            model.fused_decode = None
            want, want_kv = _scenario(runner, 3, 1000, shared=shared)
            runner.backend.set_layer_options(())
            full, _ = _scenario(runner, 6, 1500, shared=shared)
        for step, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b), f"step {step}: max diff {(a - b).abs().max().item()}"
        assert torch.equal(got_kv, want_kv)
        assert not torch.equal(got[-1], full[-1])  # the window changed the output
