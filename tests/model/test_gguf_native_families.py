"""GGUF files of the architectures served by their own native model (llama.cpp's deepseek2, glm4moe, gpt-oss, llama4,
qwen3next) end to end: a tiny transformers model written as llama.cpp's converter writes it (tests/gguf_llamacpp.py:
gguf-py's tensor names, the converter's reshapes and metadata keys), converted by gguf_convert: the same tensors
back under transformers' names, and, served by the Engine in float32, transformers' greedy tokens on the weights the
file holds, token for token, with the tensors in F32 and with the ones whose rows allow it in Q8_0 (gpt-oss's
experts in MXFP4 too). Metadata the converter does not honour is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import ExpertGatingFuncType, RopeScalingType

from gguf_llamacpp import write_llamacpp_gguf
from gguf_tiny import convert_tiny
from tiny_checkpoints import build_tiny, hf_greedy

PROMPTS = [list(range(300, 320)), [5, 77, 1200, 9, 4000, 31]]
NEW = 8
TINY = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, initializer_range=0.3,
            max_position_embeddings=256)
MLA = dict(num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
           v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
           first_k_dense_replace=1)
GLM = dict(num_key_value_heads=2, head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=1.5,
           num_nextn_predict_layers=1)
OSS = dict(num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
           sliding_window=8, layer_types=["sliding_attention", "full_attention"])
L4 = dict(num_hidden_layers=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
          intermediate_size=32, intermediate_size_mlp=96, interleave_moe_layer_step=2, attention_chunk_size=8192)
Q3N = dict(num_hidden_layers=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
           linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2,
           moe_intermediate_size=32, shared_expert_intermediate_size=32)

# name -> (gguf arch, transformers config class, its kwargs, GGUF tensors (suffixes) written as Q8_0)
CASES = {
    "deepseek_v3": ("deepseek2", "DeepseekV3Config", {**MLA, "n_group": 2, "topk_group": 1,
                                                      "routed_scaling_factor": 2.5}, ()),
    "deepseek_v2_no_q_lora": ("deepseek2", "DeepseekV2Config", {**MLA, "q_lora_rank": None,
                                                                "routed_scaling_factor": 1.5}, ()),
    "deepseek_v3_q8_0": ("deepseek2", "DeepseekV3Config", {**MLA, "n_group": 1, "topk_group": 1},
                         ("attn_kv_a_mqa.weight", "attn_v_b.weight", "attn_q_a.weight", "ffn_gate_exps.weight",
                          "ffn_up_exps.weight", "ffn_down_exps.weight", "ffn_up_shexp.weight",
                          "ffn_down_shexp.weight", "ffn_gate.weight", "ffn_up.weight")),
    # one prediction layer appended (its tensors left unread), groups, q / k norms, q / k / v bias
    "glm4moe": ("glm4moe", "Glm4MoeConfig", {**GLM, "use_qk_norm": True, "attention_bias": True}, ()),
    "glm4moe_q8_0": ("glm4moe", "Glm4MoeConfig", GLM, ("attn_q.weight", "attn_k.weight", "attn_v.weight",
                                                       "attn_output.weight", "ffn_gate_exps.weight",
                                                       "ffn_up_exps.weight", "ffn_down_exps.weight",
                                                       "ffn_gate_shexp.weight", "ffn_down_shexp.weight")),
    # yarn (GptOssConfig's default: x32 over 4,096, its betas), a window of 8 on 20-token prompts, sinks, biases
    "gpt_oss": ("gpt-oss", "GptOssConfig", OSS, ()),
    "gpt_oss_q8_0": ("gpt-oss", "GptOssConfig", OSS, ("attn_q.weight", "attn_output.weight", "ffn_gate_exps.weight",
                                                      "ffn_up_exps.weight", "ffn_down_exps.weight")),
    # the released files' experts: MXFP4 blocks
    "gpt_oss_mxfp4": ("gpt-oss", "GptOssConfig", OSS, ("ffn_gate_exps.weight", "ffn_up_exps.weight",
                                                       "ffn_down_exps.weight")),
    # four layers: three chunked RoPE layers with the L2 q / k norm, a NoPE one with temperature tuning; MoE on
    # every second layer beside dense MLPs of another width
    "llama4": ("llama4", "Llama4TextConfig", L4, ()),
    "llama4_q8_0": ("llama4", "Llama4TextConfig", L4, ("attn_q.weight", "attn_k.weight", "attn_output.weight",
                                                       "ffn_gate_exps.weight", "ffn_down_exps.weight",
                                                       "ffn_up_shexp.weight", "ffn_gate.weight")),
    # DeltaNet layers 0-2, gated full attention in layer 3 (full_attention_interval 4), the MoE's gated shared expert
    "qwen3next": ("qwen3next", "Qwen3NextConfig", Q3N, ()),
    "qwen3next_q8_0": ("qwen3next", "Qwen3NextConfig", Q3N, ("attn_qkv.weight", "attn_gate.weight", "ssm_out.weight",
                                                             "ffn_gate_exps.weight", "ffn_up_shexp.weight")),
}

KIND = {"gpt_oss_mxfp4": "MXFP4"}  # the block type of a case's quantized tensors (else Q8_0)
STEP = {"Q8_0": 1 / 100, "MXFP4": 1 / 3}  # the largest rounding error, as a fraction of the tensor's largest |value|


def _randomise_zeros(model) -> None:
    """transformers initialises biases (DeepSeek V3's e_score_correction_bias, gpt-oss's expert and router
    biases, ...) to zeros: random values make their layout count."""
    import torch

    torch.manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "e_score_correction_bias"):
                m.e_score_correction_bias.copy_(torch.randn_like(m.e_score_correction_bias) * 0.5)
        for _, p in model.named_parameters():
            if not p.any():
                p.normal_(0.0, 0.1)


def _served(model_dir: str) -> list[list[int]]:
    from radixlang_runtime import Engine

    sp = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
    with Engine(model_dir, dtype="float32", max_total_tokens=512, model_impl="native",
                debug_check_integrity=True) as eng:
        return [o["output_ids"] for o in eng.generate(input_ids=PROMPTS, sampling_params=sp)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_gguf_native_family_round_trip_and_parity(name, tmp_path):
    import torch

    arch, cls_name, kwargs, quantized = CASES[name]
    hf_dir = tmp_path / "hf"
    model = build_tiny(hf_dir, cls_name, TINY, kwargs)
    _randomise_zeros(model)
    state = model.state_dict()
    written = write_llamacpp_gguf(str(tmp_path / "m.gguf"), arch, model.config, state,
                                  kinds={n: KIND.get(name, "Q8_0") for n in _names(model, quantized)})
    assert {n.split(".", 2)[-1] for n in written if n.startswith("blk.")} >= set(quantized)
    got = convert_tiny(str(tmp_path / "m.gguf"), str(tmp_path / "conv"), str(hf_dir))
    assert set(got) == set(state)
    with open(tmp_path / "conv" / "config.json") as f:
        import json

        assert json.load(f)["architectures"] == model.config.architectures
    for k, v in state.items():
        if not quantized and arch == "qwen3next" and (k.endswith("A_log") or k.endswith("norm.weight")):
            np.testing.assert_allclose(got[k], v.numpy(), rtol=1e-6, atol=1e-6, err_msg=k)  # -exp / 1 + w and back
        elif not quantized:  # F32: the round trip is exact
            np.testing.assert_array_equal(got[k], v.numpy(), err_msg=k)
        else:  # within the block type's step
            step = STEP[KIND.get(name, "Q8_0")]
            np.testing.assert_allclose(got[k], v.numpy(), atol=float(v.abs().max()) * step + 1e-6, err_msg=k)
    changed = sum(not np.array_equal(got[k], v.numpy()) for k, v in state.items())
    assert changed >= (len(quantized) // 2 if quantized else 0)  # the Q8_0 tensors hold quantized values
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in got.items()})  # the file's values
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    assert sum(len(set(w)) > 1 for w in want) >= 1  # not a degenerate model
    assert _served(str(tmp_path / "conv")) == want


def _names(model, suffixes) -> list[str]:
    return [f"blk.{i}.{s}" for i in range(model.config.num_hidden_layers) for s in suffixes]


# name -> (case, GGUF keys beyond the converter's (GGUFWriter add_*), the error)
REFUSED = {
    "v2_groups": ("deepseek_v2_no_q_lora", {"expert_group_count": 2, "expert_group_used_count": 1},
                  "expert_group_count 2 with softmax gating is not supported"),
    "temperature": ("deepseek_v3", {"attn_temperature_scale": 0.1},
                    "GGUF key 'deepseek2.attention.temperature_scale' is not supported"),
    "rope_type": ("deepseek_v3", {"rope_scaling_type": RopeScalingType.LINEAR, "rope_scaling_factor": 2.0},
                  "deepseek2 rope scaling 'linear' is not supported"),
    "glm_softmax": ("glm4moe", {"expert_gating_func": ExpertGatingFuncType.SOFTMAX},
                    "glm4moe.expert_gating_func 1 is not supported"),
    "oss_pattern": ("gpt_oss", {"sliding_window_pattern": 3},
                    "GGUF key 'gpt-oss.attention.sliding_window_pattern' is not supported"),
    "llama4_swa_theta": ("llama4", {"rope_freq_base_swa": 10.0}, "llama4.rope.freq_base_swa 10.0 != rope.freq_base"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_metadata_not_honoured_is_refused_by_name(name, tmp_path):
    import gguf

    from radixlang_runtime.model.loader.gguf_convert import gguf_to_hf_config

    case, keys, message = REFUSED[name]
    arch, cls_name, kwargs, _ = CASES[case]
    model = build_tiny(tmp_path / "hf", cls_name, TINY, kwargs)
    write_llamacpp_gguf(str(tmp_path / "m.gguf"), arch, model.config, model.state_dict(), extra=keys)
    with pytest.raises(ValueError, match=message):
        gguf_to_hf_config(gguf.GGUFReader(str(tmp_path / "m.gguf")))


def test_deepseek2_yarn_keys_map_to_transformers_fields(tmp_path):
    """rope.scaling.yarn_log_multiplier is 0.1 * mscale_all_dim (DeepseekV2Model.set_gguf_parameters)."""
    import gguf

    from radixlang_runtime.model.loader.gguf_convert import gguf_to_hf_config

    arch, cls_name, kwargs, _ = CASES["deepseek_v3"]
    model = build_tiny(tmp_path / "hf", cls_name, {**TINY, "num_hidden_layers": 1}, {**kwargs,
                                                                                   "first_k_dense_replace": 0})
    keys = {"rope_scaling_type": gguf.RopeScalingType.YARN, "rope_scaling_factor": 40.0,
            "rope_scaling_orig_ctx_len": 4096, "rope_scaling_yarn_log_mul": 0.1 * 0.707}
    write_llamacpp_gguf(str(tmp_path / "m.gguf"), arch, model.config, model.state_dict(), extra=keys)
    cfg = gguf_to_hf_config(gguf.GGUFReader(str(tmp_path / "m.gguf")))
    scaling = cfg["rope_scaling"]
    assert (scaling["rope_type"], scaling["factor"], scaling["original_max_position_embeddings"]) == ("yarn", 40.0,
                                                                                                        4096)
    assert scaling["mscale"] == 0.707 and scaling["mscale_all_dim"] == 0.707
    assert (cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]) == (16, 8, 8)
    assert cfg["num_key_value_heads"] == 4 and cfg["architectures"] == ["DeepseekV3ForCausalLM"]
