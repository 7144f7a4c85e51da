"""Pre-quantized HF checkpoints (model/prequant/): tiny random Llamas written in AutoAWQ's GEMM layout,
GPTQ's (v1 zeros, act order with g_idx, 8-bit), llm-compressor's compressed-tensors (pack-quantized W4A16 /
W8A16, FP8) and DeepSeek-style block FP8 (tests/prequant_layouts.py); the Engine serves each in float32
and its greedy tokens equal transformers' on the values the layout encodes (dequantized in numpy). The
integer / FP8 weights stay resident in the linears; fields not implemented are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from prequant_layouts import quantize_awq, quantize_ct_packed, quantize_fp8, quantize_gptq, write_prequant
from radixlang_runtime.model.loader.config import ModelConfig
from tiny_checkpoints import build_tiny, hf_greedy

PROMPTS = [list(range(300, 320)), [5, 77, 1200, 9, 4000, 31]]
NEW = 16
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3, max_position_embeddings=256)
PERMS = {k: np.random.default_rng(k).permutation(k) for k in (64, 128)}  # act order per input width

GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True,
        "checkpoint_format": "gptq", "damp_percent": 0.01, "true_sequential": True, "static_groups": False,
        "lm_head": False}


def ct_config(fmt: str, weights: dict) -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "dynamic": False, "actorder": None, "observer": "minmax", **weights},
                "input_activations": None, "output_activations": None}},
            "ignore": ["lm_head"], "kv_cache_scheme": None, "sparsity_config": {}}


# name -> (one linear's quantizer, quantization_config, the linears left in float, gate_up's expected class)
CASES = {
    "awq": (quantize_awq, {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
                           "version": "gemm", "modules_to_not_convert": ["down_proj"]},
            ("mlp.down_proj",), "GGUFLinear"),
    "gptq4": (quantize_gptq, GPTQ, (), "GGUFLinear"),
    "gptq4_act_order": (lambda w: quantize_gptq(w, sym=False, perm=PERMS[w.shape[1]]),
                        {**GPTQ, "desc_act": True, "sym": False}, (), "PermutedInput"),
    "gptq8_channel": (lambda w: quantize_gptq(w, gs=w.shape[1], bits=8),
                      {**GPTQ, "bits": 8, "group_size": -1}, (), "GGUFLinear"),
    "ct_w4a16": (quantize_ct_packed, ct_config("pack-quantized", {
        "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}), (),
        "DequantLinear"),  # float32 scales: not fp16-exact, so not Q8_0 blocks
    "ct_w8a16": (lambda w: quantize_ct_packed(w, gs=-1, bits=8, scale_dtype=np.float16), ct_config(
        "pack-quantized", {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}), (),
        "GGUFLinear"),
    "ct_fp8": (lambda w: quantize_fp8(w, None, "weight_scale"), ct_config(
        "float-quantized", {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"}), (),
        "DequantLinear"),
    "fp8_block": (lambda w: quantize_fp8(w, (32, 48)), {"quant_method": "fp8", "activation_scheme": "dynamic",
                                                        "fmt": "e4m3", "weight_block_size": [32, 48]}, (),
                  "DequantLinear"),
}


def reference(model) -> list[list[int]]:
    """transformers' greedy tokens for PROMPTS, on one thread (many threads on a loaded 2-core machine
    make tiny forwards an order of magnitude slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [hf_greedy(model, p, NEW) for p in PROMPTS]
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def float_tiny(tmp_path_factory):
    """One tiny float Llama (saved with the tokenizer) and its own greedy tokens, shared by the cases."""
    path = tmp_path_factory.mktemp("float_tiny")
    model = build_tiny(path, "LlamaConfig", TINY, {})
    return path, model, reference(model)


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_matches_transformers_on_the_dequantized_values(name, tmp_path, float_tiny):
    import copy
    import shutil

    from radixlang_runtime import Engine

    quantize, qc, skip, linear_cls = CASES[name]
    src, float_model, float_tokens = float_tiny
    shutil.copytree(src, tmp_path, dirs_exist_ok=True)
    model = copy.deepcopy(float_model)
    write_prequant(tmp_path, model, quantize, qc, skip)
    want = reference(model)
    assert want != float_tokens  # the quantization changes transformers' own tokens: the comparison can fail
    with Engine(str(tmp_path), dtype="float32", max_total_tokens=1024) as eng:
        layer = eng.runner.model.layers[0]
        assert type(layer.mlp.gate_up_proj).__name__ == linear_cls
        assert type(layer.self_attn.qkv_proj).__name__ == linear_cls  # q/k/v fused on their codes
        if "mlp.down_proj" in skip:
            assert type(layer.mlp.down_proj).__name__ not in ("GGUFLinear", "DequantLinear")
        resident = [b for b in eng.runner.model.buffers()] + [
            t for m in eng.runner.model.modules() for t in vars(m).values() if isinstance(t, torch.Tensor)]
        assert any(t.dtype in (torch.int8, torch.uint8, torch.float8_e4m3fn) for t in resident)
        assert eng.get_stats()["cpu"]["paths"]["linear"].startswith(qc["quant_method"])
        sp = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
        one = eng.generate(input_ids=PROMPTS[0], sampling_params=sp)  # decode batches of M = 1
        outs = eng.generate(input_ids=PROMPTS, sampling_params=sp)
    assert one["output_ids"] == want[0]
    assert [o["output_ids"] for o in outs] == want


BASE = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 256}
W4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}


@pytest.mark.parametrize("qc,needle", [
    ({"quant_method": "bitsandbytes"}, r"quant_method 'bitsandbytes' is not supported"),
    ({"quant_method": "awq", "bits": 4, "zero_point": False}, r"\(awq\): zero_point False"),
    ({"quant_method": "awq", "bits": 4, "version": "gemv"}, r"\(awq\): version 'gemv'"),
    ({**GPTQ, "bits": 3}, r"\(gptq\): bits 3"),
    ({**GPTQ, "checkpoint_format": "marlin"}, r"\(gptq\): checkpoint_format 'marlin'"),
    ({**ct_config("pack-quantized", W4), "config_groups": {"group_0": {
        "weights": {**W4, "num_bits": 8, "group_size": None, "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "int", "dynamic": True}}}},
     r"config_groups.group_0.input_activations .* \(activation quantization"),
    (ct_config("pack-quantized", {**W4, "symmetric": False}), r"weights.symmetric False"),
    (ct_config("marlin-24", W4), r"format 'marlin-24'"),
    ({**ct_config("pack-quantized", W4), "kv_cache_scheme": {"num_bits": 8}}, r"kv_cache_scheme"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, r"\(fp8\): activation_scheme 'static'"),
])
def test_unimplemented_fields_are_refused_by_name(qc, needle):
    with pytest.raises(ValueError, match=needle):
        ModelConfig.from_dict({**BASE, "quantization_config": qc})


def test_prequant_refuses_flags_it_cannot_combine_with(tmp_path, float_tiny):
    import copy
    import shutil

    from radixlang_runtime import Engine

    shutil.copytree(float_tiny[0], tmp_path, dirs_exist_ok=True)
    model = copy.deepcopy(float_tiny[1])
    write_prequant(tmp_path, model, quantize_gptq, {**GPTQ, "desc_act": True})
    with pytest.raises(ValueError, match="--quantization int8 is not supported with a pre-quantized checkpoint"):
        Engine(str(tmp_path), dtype="float32", max_total_tokens=1024, quantization="int8")
    # desc_act true: the g_idx each column's group comes from must be in the checkpoint
    from safetensors.torch import load_file, save_file

    f = str(tmp_path / "model.safetensors")
    save_file({k: v for k, v in load_file(f).items() if not k.endswith(".g_idx")}, f, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"desc_act true needs the checkpoint's model.layers.0.self_attn.q_proj.g_idx"):
        Engine(str(tmp_path), dtype="float32", max_total_tokens=1024)
