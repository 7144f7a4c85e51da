"""--quantization int8 / gguf on the real model (the kernels themselves are checked against
dequantize-then-matmul per ISA in test_cpu_linears).

int8: the Engine answers sensibly in one stream (C kernel) and in a batch above the kernel's M (packed
dequantized path), reports its path, and the allocator is whole. Greedy text may drift from the
unquantized model's (int8 rounding), so it is not compared token for token; the top choice of the
first token must be among the unquantized model's top 5.
gguf: the linears run on the embedded GGUF's own Q4_1 / Q8_0 blocks, the values the dequantized
checkpoint holds, so float32 greedy output equals transformers' token for token (one stream through
the block kernel, a batch of 10 through the packed path above M 16 for prefill). On a bf16 model the
decode batches quantize their activations to int8 (gemv_q8.c, llama.cpp's scheme): checked like int8."""

from __future__ import annotations

import pytest

from conftest import assert_whole, wait_idle
from radixlang_runtime import Engine
from radixlang_runtime.server_args import ServerArgs

pytestmark = pytest.mark.slow

CHAT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def _answers_like_the_unquantized_model(eng, engine) -> None:
    """Quantized greedy text may drift, so: a sensible answer in one stream (the C decode kernels), a batch
    of 20 above their M, the first token among the unquantized model's top 5, the allocator whole."""
    one = eng.generate(CHAT, {"max_new_tokens": 16, "temperature": 0})
    assert "Paris" in one["text"], one["text"]
    batch = eng.generate([f"Count to {i}:" for i in range(20)], {"max_new_tokens": 6, "temperature": 0})
    assert all(o["meta_info"]["completion_tokens"] == 6 for o in batch)
    sp = {"max_new_tokens": 1, "temperature": 0}
    q_first = eng.generate(CHAT, sp)["output_ids"][0]
    ref_top = engine.generate(CHAT, sp, return_logprob=True, top_logprobs_num=5)["meta_info"]["output_top_logprobs"][0]
    assert q_first in [t[1] for t in ref_top], (q_first, ref_top)
    wait_idle(eng)
    assert_whole(eng)


def test_only_implemented_quantizations_are_accepted():
    with pytest.raises(ValueError, match="int8 .* and gguf"):
        ServerArgs(quantization="q4_1")


def test_gguf_blocks_match_transformers_in_float32(hf_greedy):
    from conftest import PROMPTS

    eng = Engine(quantization="gguf", dtype="float32", max_total_tokens=4096)
    try:
        assert eng.get_stats()["cpu"]["paths"]["linear"].startswith("gguf Q4_1/Q8_0 blocks:")
        from radixlang_runtime.model.layers.gguf_linear import GGUFLinear

        assert isinstance(eng.runner.model.head, GGUFLinear) and eng.runner.model.head.fmt == "Q8_0"
        assert isinstance(eng.runner.model.layers[0].mlp.gate_up_proj, GGUFLinear)
        ids = [eng.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
        sp = {"max_new_tokens": 16, "min_new_tokens": 16, "temperature": 0}
        one = eng.generate(input_ids=ids[0], sampling_params=sp)  # decode steps of M = 1
        assert one["output_ids"] == hf_greedy(ids[0], 16)
        for p, x, out in zip(PROMPTS, ids, eng.generate(input_ids=ids, sampling_params=sp)):
            assert out["output_ids"] == hf_greedy(x, 16), p
        assert_whole(eng)
    finally:
        eng.shutdown()


def test_gguf_bf16_runs_int8_activations(engine):
    from radixlang_kernels.cpu_ops import load
    from radixlang_runtime.model.layers.gguf_linear import GGUFLinear, GGUFTiedEmbedding

    eng = Engine(quantization="gguf", dtype="bfloat16", max_total_tokens=4096)
    try:
        model = eng.runner.model
        head, gate_up = model.head, model.layers[0].mlp.gate_up_proj
        # the tied head's Q8_0 int8 tiles, the embedding reading its rows from them (one copy); the layers' Q4_1
        assert isinstance(head, GGUFLinear) and head.fmt == "Q8_0"
        assert isinstance(gate_up, GGUFLinear) and gate_up.fmt == "Q4_1"
        if load() is not None:
            assert head.q8 and head.blocks is None and head.tiles is not None
            assert isinstance(model.embed_tokens, GGUFTiedEmbedding) and model.embed_tokens.head[0] is head
            assert gate_up.q8 and gate_up.blocks is None and gate_up.tiles is not None
            assert "x int8 activations" in eng.get_stats()["cpu"]["paths"]["linear"]
            assert "int8 GEMM on the blocks" in eng.get_stats()["cpu"]["paths"]["linear"]
        _answers_like_the_unquantized_model(eng, engine)
    finally:
        eng.shutdown()


def test_gguf_needs_a_gguf_model(tmp_path):
    """A plain HF directory (the converted files, linked under another name, without the record of
    their source) has no blocks to run on: a ValueError naming the problem."""
    import os

    from radixlang_runtime.model.loader.gguf_convert import SOURCE_FILE
    from radixlang_runtime.model.loader.resolve import resolve_model_dir

    src = resolve_model_dir(None)
    for name in os.listdir(src):
        if name != SOURCE_FILE:
            os.symlink(os.path.join(src, name), tmp_path / name)
    with pytest.raises(ValueError, match="not converted from one"):
        Engine(str(tmp_path), quantization="gguf", max_total_tokens=1024)


def test_int8_engine(engine):
    eng = Engine(quantization="int8", max_total_tokens=4096)
    try:
        assert eng.get_stats()["cpu"]["paths"]["linear"].startswith("int8:")
        _answers_like_the_unquantized_model(eng, engine)
    finally:
        eng.shutdown()
