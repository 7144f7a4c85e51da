"""GGUF architectures end to end: a tiny transformers model written as a GGUF the way llama.cpp lays it out
(tests/gguf_tiny.py), converted by gguf_convert, gives back the same tensors under the same names and, served
by the Engine in float32, transformers' greedy tokens on the original model (F32 blocks: the round trip is
exact, so the config mapping is what is tested). A llama file in the common block types equals transformers'
own GGUF loader tensor for tensor and in its greedy tokens."""

from __future__ import annotations


import numpy as np
import pytest
from gguf import ExpertGatingFuncType, RopeScalingType

from gguf_tiny import convert_tiny, k_quant_blocks, write_gguf
from tiny_checkpoints import build_tiny, hf_greedy

PROMPTS = [list(range(300, 320)), [5, 77, 1200, 9, 4000, 31]]
NEW = 10
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3, max_position_embeddings=256)
MOE = {"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 32}
SHORT, LONG = [1.0 + 0.1 * i for i in range(4)], [2.0 + 0.5 * i for i in range(4)]


def _llama3_rope():
    from radixlang_runtime.model.loader.gguf_families import llama3_factors

    return {"rope_freqs.weight": llama3_factors(10000.0, 16, 8.0, 1.0, 4.0, 32)}


# name -> (gguf arch, transformers config class, its kwargs, GGUF keys (GGUFWriter add_*), RoPE tensors, Engine kwargs)
CASES = {
    "llama3": ("llama", "LlamaConfig", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                          "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 32}},
               {}, _llama3_rope, {}),
    "qwen2": ("qwen2", "Qwen2Config", {}, {}, None, {}),
    "qwen3": ("qwen3", "Qwen3Config", {"head_dim": 16}, {"key_length": 16, "value_length": 16}, None, {}),
    "qwen2moe": ("qwen2moe", "Qwen2MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                                "shared_expert_intermediate_size": 48, "mlp_only_layers": [1]},
                 {**MOE, "expert_shared_feed_forward_length": 48}, None, {}),
    "qwen3moe": ("qwen3moe", "Qwen3MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                                "head_dim": 16, "norm_topk_prob": True},
                 {**MOE, "key_length": 16, "value_length": 16}, None, {}),
    # partial rotary (8 of 16 lanes) with longrope inside its original window (Phi-3's served range)
    "phi3": ("phi3", "Phi3Config", {"partial_rotary_factor": 0.5, "max_position_embeddings": 128,
                                    "original_max_position_embeddings": 32,
                                    "rope_scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG}},
             {"rope_dimension_count": 8, "rope_scaling_orig_ctx_len": 32},
             lambda: {"rope_factors_short.weight": SHORT, "rope_factors_long.weight": LONG}, {"context_length": 32}),
}


# Gemma: norms stored as 1 + w (random here, so the shift counts), GGUF keys as llama.cpp writes them; windows of 8
# with 20-token prompts; gemma3: layer 0 slides (its own rope theta), layer 1 is global (linear scaling x2)
GEMMA = {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 8, "initializer_range": 0.1}
GEMMA_KEYS = {"key_length": 16, "value_length": 16, "sliding_window": 8}
G3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
           "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}
CASES.update({
    "gemma2": ("gemma2", "Gemma2Config", {**GEMMA, "final_logit_softcapping": 3.0, "attn_logit_softcapping": 0.5},
               {**GEMMA_KEYS, "final_logit_softcapping": 3.0, "attn_logit_softcapping": 0.5}, None, {}),
    "gemma3": ("gemma3", "Gemma3TextConfig", {**GEMMA, "layer_types": ["sliding_attention", "full_attention"],
                                              "rope_parameters": G3_ROPE, "final_logit_softcapping": 8.0},
               {**GEMMA_KEYS, "sliding_window_pattern": 2, "rope_freq_base_swa": 100.0, "rope_scaling_type":
                RopeScalingType.LINEAR, "rope_scaling_factor": 2.0, "final_logit_softcapping": 8.0}, None, {}),
})


def _as_stored(arch: str, name: str, w: np.ndarray) -> np.ndarray:
    """What the converter can give back for an HF tensor: Gemma's norms went through 1 + w in float32."""
    if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
        return (w + np.float32(1.0)) - np.float32(1.0)
    return w


_convert = convert_tiny


def _served(model_dir: str, block_linears: int = 0, **engine_kwargs) -> list[list[int]]:
    """Greedy ids of PROMPTS; block_linears: how many linears must run on GGUF blocks (--quantization gguf)."""
    from radixlang_runtime import Engine
    from radixlang_runtime.model.layers.gguf_linear import GGUFLinear

    sp = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
    with Engine(model_dir, dtype="float32", max_total_tokens=1024, model_impl="native", **engine_kwargs) as eng:
        assert sum(isinstance(m, GGUFLinear) for m in eng.runner.model.modules()) == block_linears
        return [o["output_ids"] for o in eng.generate(input_ids=PROMPTS, sampling_params=sp)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_gguf_family_round_trip_and_parity(name, tmp_path):
    arch, cls_name, kwargs, keys, rope, engine_kwargs = CASES[name]
    import torch

    hf_dir = tmp_path / "hf"
    model = build_tiny(hf_dir, cls_name, TINY, kwargs)
    if arch.startswith("gemma"):  # Gemma initialises its norms to 0 (a gain of 1): make them count
        torch.manual_seed(1)
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.data.normal_(0.0, 0.3)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied: no output.weight
    write_gguf(str(tmp_path / "m.gguf"), arch, model.config, state, extra=keys, rope_tensors=rope() if rope else None)
    got = _convert(str(tmp_path / "m.gguf"), str(tmp_path / "conv"), str(hf_dir))
    assert set(got) == set(state)
    for k, v in state.items():
        np.testing.assert_array_equal(got[k], _as_stored(arch, k, v.numpy()), err_msg=k)
    if arch.startswith("gemma"):  # the norms' 1 + w convention: transformers' own GGUF loader reads the same tensors
        from transformers import AutoModelForCausalLM

        theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf", dtype=torch.float32)
        for k, v in theirs.state_dict().items():
            if k != "lm_head.weight":
                np.testing.assert_array_equal(got[k], v.numpy(), err_msg=k)
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in got.items()}, strict=False)  # the same weights
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    assert _served(str(tmp_path / "conv"), **engine_kwargs) == want


# the common block types on a llama file: rows of 256 values (K-quants' super-block)
BLOCKS = {"attn_q.weight": "Q8_0", "attn_k.weight": "Q4_0", "attn_v.weight": "Q4_1", "attn_output.weight": "Q5_0",
          "ffn_gate.weight": "Q4_K", "ffn_up.weight": "Q5_K", "ffn_down.weight": "Q6_K", "token_embd.weight": "F16"}


def test_llama_in_common_block_types_equals_transformers_gguf_loader(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    hf_dir = tmp_path / "hf"
    model = build_tiny(hf_dir, "LlamaConfig", {**TINY, "hidden_size": 256, "intermediate_size": 256}, {})
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    kinds = {}
    for i in range(model.config.num_hidden_layers):
        for j, (suffix, kind) in enumerate(BLOCKS.items()):
            blocks = k_quant_blocks(kind, 256, 256, seed=10 * i + j) if kind.endswith("_K") else None
            kinds[f"blk.{i}.{suffix}"] = (kind, blocks)
    kinds["token_embd.weight"] = ("F16", None)
    # layer 1's attention in the formats --quantization gguf keeps (q / k / v fuse: one format), the rest dense
    kinds.update({f"blk.1.attn_{p}.weight": ("Q4_1", None) for p in "qkv"}, **{"blk.1.attn_output.weight":
                                                                                ("Q8_0", None)})
    path = str(tmp_path / "m.gguf")
    write_gguf(path, "llama", model.config, state, kinds=kinds)
    got = _convert(path, str(tmp_path / "conv"), str(hf_dir))
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf", dtype=torch.float32).eval()
    ref_state = ref.state_dict()
    for k, v in got.items():
        np.testing.assert_array_equal(v, ref_state[k].numpy(), err_msg=k)
    assert not np.array_equal(got["model.layers.0.mlp.up_proj.weight"], state["model.layers.0.mlp.up_proj.weight"])
    want = [hf_greedy(ref, p, NEW) for p in PROMPTS]
    assert _served(str(tmp_path / "conv")) == want
    # --quantization gguf: layer 1's attention on gguf_linear's Q4_1 / Q8_0 blocks (float32 sums of the same
    # values), every other type (Q4_0, Q5_0, the K-quants, mixed q / k / v) on gguf_block_linear's
    assert _served(str(tmp_path / "conv"), block_linears=2, quantization="gguf") == want


def test_llama3_factors_equal_transformers_and_are_found_back():
    """Llama 3.1's parameters: llama.cpp's rope_freqs are transformers' llama3 inv_freq divided into the plain
    one, and the converter finds parameters that reproduce them."""
    import torch
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from radixlang_runtime.model.loader.gguf_families import _llama3_from_freqs, llama3_factors

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    cfg = LlamaConfig(hidden_size=4096, num_attention_heads=32, max_position_embeddings=131072, rope_parameters=rope)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, torch.device("cpu"))
    plain = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    factors = llama3_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    np.testing.assert_allclose(factors, (plain / scaled.double()).numpy(), rtol=1e-5)
    assert len(set(np.round(factors, 6))) > 3  # ones, eights and the smooth band between
    found = _llama3_from_freqs(factors, 500000.0, 128)
    assert found["factor"] == 8.0
    np.testing.assert_allclose(llama3_factors(500000.0, 128, found["factor"], found["low_freq_factor"],
                                              found["high_freq_factor"], found["original_max_position_embeddings"]),
                               factors, rtol=1e-6)


def _keys_file(tmp_path, arch: str, keys: dict) -> object:
    """A GGUF of `arch` with the shared keys, `keys` (GGUFWriter add_* names) and one tiny tensor."""
    import gguf

    path = str(tmp_path / f"{arch}.gguf")
    w = gguf.GGUFWriter(path, arch)
    for key, value in {"block_count": 2, "context_length": 64, "embedding_length": 64, "feed_forward_length": 128,
                       "head_count": 4, "head_count_kv": 2, "layer_norm_rms_eps": 1e-6, "vocab_size": 100,
                       **keys}.items():
        getattr(w, f"add_{key}")(value)
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return gguf.GGUFReader(path)


@pytest.mark.parametrize("arch,keys,message", [
    ("gemma2", {"attention_scale": 0.1}, "GGUF key 'gemma2.attention.scale' is not supported"),
    ("llama", {"expert_count": 8}, "GGUF key 'llama.expert_count' is not supported"),
    ("qwen2", {"sliding_window": 64}, "GGUF key 'qwen2.attention.sliding_window' is not supported"),
    ("gemma3", {"key_length": 16, "value_length": 32}, "value_length 32 != key_length 16"),
    ("qwen3moe", {"expert_gating_func": ExpertGatingFuncType.SIGMOID, "expert_count": 4, "expert_used_count": 2},
     "expert_gating_func 2 is not supported"),
])
def test_metadata_keys_not_honoured_are_refused_by_name(tmp_path, arch, keys, message):
    from radixlang_runtime.model.loader.gguf_convert import gguf_to_hf_config

    with pytest.raises(ValueError, match=message):
        gguf_to_hf_config(_keys_file(tmp_path, arch, keys))


@pytest.mark.parametrize("arch,layers,keys,types,scalar", [
    ("gemma2", 3, {}, "SFS", 16),  # llama.cpp's period 2: even layers slide; scale by head_dim
    ("gemma3", 7, {}, "SSSSSFS", 16),  # period 6
    ("gemma3", 3, {"sliding_window_pattern": [False, True, True]}, "FSS", 16),  # per layer
    ("gemma3", 2, {"sliding_window_pattern": 1}, "FF", 16),  # every layer global
    ("gemma2", 46, {}, "SF" * 23, 32),  # 27B: hidden / heads (128 / 4), not head_dim
])
def test_gemma_layer_pattern_and_query_scale(tmp_path, arch, layers, keys, types, scalar):
    from radixlang_runtime.model.loader.gguf_convert import gguf_to_hf_config

    cfg = gguf_to_hf_config(_keys_file(tmp_path, arch, {"block_count": layers, "embedding_length": 128,
                                                        "key_length": 16, "value_length": 16, "sliding_window": 8,
                                                        **keys}))
    assert "".join(t[0].upper() for t in cfg["layer_types"]) == types
    assert cfg["query_pre_attn_scalar"] == scalar and cfg["sliding_window"] == 8
    assert cfg["hidden_activation"] == "gelu_pytorch_tanh"
    if arch == "gemma3":  # no freq_base_swa key: llama.cpp's local theta
        assert cfg["rope_parameters"]["sliding_attention"]["rope_theta"] == 10000.0
