"""GGUF files of the natively served architectures (deepseek2, glm4moe, gpt-oss, granitehybrid, llama4, qwen3next)
written from a tiny transformers model the way llama.cpp's convert_hf_to_gguf.py writes them: tensor names from
gguf-py's own map (gguf.get_tensor_name_map, which the converter uses), experts stacked per layer, DeepSeek's
kv_b_proj split into attn_k_b (transposed) / attn_v_b, the Mamba2 hybrids' changes (gguf_llamacpp_mamba2.py), and
the metadata keys each converter class writes (gguf.Keys through GGUFWriter's add_*). The names and reshapes come
from gguf-py and the converter, not from the loader's tables."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from gguf_llamacpp_mamba2 import granitehybrid_keys, granitehybrid_modify, nemotron_h_keys, nemotron_h_modify


def _hf_tensors(state: dict, arch: str) -> dict[str, np.ndarray]:
    """transformers 5's state dict as the hub checkpoints the converter reads name them: stacked experts
    split into gate / up / down (the converter stacks them back per layer: [E, I, hidden] / [E, hidden, I]);
    gpt-oss's and Llama 4's hub checkpoints hold the stacked tensors themselves."""
    out = {}
    for name, t in state.items():
        w = t.float().numpy()
        if arch in ("gpt-oss", "llama4"):
            out[name] = w
        elif name.endswith("mlp.experts.gate_up_proj"):
            inter = w.shape[1] // 2
            out[name[: -len("gate_up_proj")] + "gate_proj.weight"] = w[:, :inter]
            out[name[: -len("gate_up_proj")] + "up_proj.weight"] = w[:, inter:]
        elif name.endswith("mlp.experts.down_proj"):
            out[name + ".weight"] = w
        elif name.endswith("e_score_correction_bias"):  # the converter's rename (base.py modify_tensors)
            out[name.replace("e_score_correction_bias", "e_score_correction.bias")] = w
        else:
            out[name] = w
    return out


def deepseek2_split_kv_b(name: str, w: np.ndarray, cfg) -> dict[str, np.ndarray]:
    """DeepseekV2Model.modify_tensors: kv_b_proj [H (nope + v), C] -> k_b [H, C, nope] (transposed), v_b [H, v, C]."""
    heads, nope, v = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
    kv_b = w.reshape(heads, nope + v, w.shape[-1])
    return {name.replace("kv_b_proj", "k_b_proj"): np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1)),
            name.replace("kv_b_proj", "v_b_proj"): np.ascontiguousarray(kv_b[:, nope:])}


def deepseek2_keys(w, cfg) -> None:
    """DeepseekV2Model.set_gguf_parameters beyond the shared ones (MLA as MQA with the head sizes in *_mla)."""
    w.add_head_count_kv(1)
    w.add_leading_dense_block_count(cfg.first_k_dense_replace)
    if cfg.q_lora_rank is not None:
        w.add_q_lora_rank(cfg.q_lora_rank)
    w.add_kv_lora_rank(cfg.kv_lora_rank)
    w.add_key_length(cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    w.add_value_length(cfg.kv_lora_rank)
    w.add_key_length_mla(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
    w.add_value_length_mla(cfg.v_head_dim)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_count(cfg.n_routed_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_shared_count(cfg.n_shared_experts)
    w.add_expert_weights_scale(cfg.routed_scaling_factor)
    if cfg.norm_topk_prob:
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(cfg.qk_rope_head_dim)
    if getattr(cfg, "n_group", None) is not None:
        w.add_expert_group_count(cfg.n_group)
        w.add_expert_group_used_count(cfg.topk_group)
    scoring = getattr(cfg, "scoring_func", None) or ("sigmoid" if cfg.model_type == "deepseek_v3" else None)
    if scoring is not None:
        import gguf

        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if scoring == "sigmoid"
                                 else gguf.ExpertGatingFuncType.SOFTMAX)


def glm4moe_keys(w, cfg) -> None:
    """Glm4MoeModel.set_gguf_parameters beyond the shared ones; block_count counts the prediction layers."""
    import gguf

    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_group_count(cfg.n_group)
    w.add_expert_group_used_count(cfg.topk_group)
    w.add_rope_dimension_count(int(cfg.head_dim * cfg.rope_parameters.get("partial_rotary_factor", 0.5)))
    w.add_expert_count(cfg.n_routed_experts)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_shared_count(cfg.n_shared_experts)
    w.add_leading_dense_block_count(cfg.first_k_dense_replace)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(cfg.routed_scaling_factor)
    w.add_expert_weights_norm(cfg.norm_topk_prob)
    w.add_nextn_predict_layers(cfg.num_nextn_predict_layers)


def gpt_oss_keys(w, cfg) -> None:
    """GptOssModel.set_gguf_parameters with the shared ones it adds (head_dim, experts, yarn)."""
    import gguf

    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_expert_count(cfg.num_local_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    rope = cfg.rope_parameters
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    w.add_sliding_window(cfg.sliding_window)
    w.add_expert_feed_forward_length(cfg.intermediate_size)


def gpt_oss_modify(name: str, w: np.ndarray, cfg) -> dict[str, np.ndarray]:
    """GptOssModel.filter_tensors / modify_tensors for unquantized experts: sinks named .weight, gate_up
    [E, hidden, 2I] transposed and split by even / odd rows, down transposed, the biases renamed alike."""
    if name.endswith("sinks"):
        return {name + ".weight": w}
    if name.endswith("down_proj_bias"):
        return {name.replace("down_proj_bias", "down_proj.bias"): w}
    if name.endswith("down_proj"):
        return {name + ".weight": np.ascontiguousarray(w.transpose(0, 2, 1))}
    if name.endswith("gate_up_proj_bias"):
        return {name.replace("gate_up_proj_bias", "gate_proj.bias"): w[..., ::2],
                name.replace("gate_up_proj_bias", "up_proj.bias"): w[..., 1::2]}
    if name.endswith("gate_up_proj"):
        t = w.transpose(0, 2, 1)
        return {name.replace("gate_up_proj", "gate_proj.weight"): np.ascontiguousarray(t[:, ::2]),
                name.replace("gate_up_proj", "up_proj.weight"): np.ascontiguousarray(t[:, 1::2])}
    return {name: w}


def llama4_keys(w, cfg) -> None:
    """Llama4Model.set_gguf_parameters (LlamaModel's with the shared ones): the dense width is
    intermediate_size_mlp, the experts' intermediate_size."""
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_expert_count(cfg.num_local_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_interleave_moe_layer_step(cfg.interleave_moe_layer_step)
    w.add_expert_feed_forward_length(cfg.intermediate_size)


def llama4_modify(name: str, w: np.ndarray, cfg) -> dict[str, np.ndarray]:
    """Llama4Model.modify_tensors: gate_up [E, hidden, 2I] transposed and split in halves, down transposed."""
    if name.endswith("gate_up_proj"):
        gate, up = np.split(w.transpose(0, 2, 1), 2, axis=1)
        return {name.replace("gate_up_proj", "gate_proj.weight"): np.ascontiguousarray(gate),
                name.replace("gate_up_proj", "up_proj.weight"): np.ascontiguousarray(up)}
    if name.endswith("down_proj"):
        return {name + ".weight": np.ascontiguousarray(w.transpose(0, 2, 1))}
    return {name: w}


def qwen3next_keys(w, cfg) -> None:
    """Qwen3NextModel.set_gguf_parameters with Qwen2MoeModel's and the shared ones."""
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    w.add_ssm_conv_kernel(cfg.linear_conv_kernel_dim)
    w.add_ssm_state_size(cfg.linear_key_head_dim)
    w.add_ssm_group_count(cfg.linear_num_key_heads)
    w.add_ssm_time_step_rank(cfg.linear_num_value_heads)
    w.add_ssm_inner_size(cfg.linear_value_head_dim * cfg.linear_num_value_heads)
    w.add_full_attention_interval(cfg.to_dict().get("full_attention_interval", 4))  # config.json's, else 4
    w.add_rope_dimension_count(int(cfg.head_dim * cfg.rope_parameters.get("partial_rotary_factor", 0.25)))


def qwen3next_modify(name: str, w: np.ndarray, cfg) -> dict[str, np.ndarray]:
    """Qwen3NextModel.modify_tensors: A_log -> -exp, dt_bias renamed, conv1d squeezed, 1 + w norms (not the
    DeltaNet's), in_proj_qkvz regrouped into qkv (every head's q, then k, then v) and the gate z."""
    if name.endswith(".A_log"):
        return {name: (-np.exp(w.astype(np.float64))).astype(np.float32)}
    if name.endswith(".dt_bias"):
        return {name.replace(".dt_bias", ".dt_proj.bias"): w}
    if "conv1d" in name:
        return {name: np.ascontiguousarray(w.squeeze())}
    if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        return {name: w + np.float32(1.0)}
    if name.endswith("in_proj_qkvz.weight"):
        nk, dk = cfg.linear_num_key_heads, cfg.linear_key_head_dim
        vz = cfg.linear_num_value_heads // nk * cfg.linear_value_head_dim
        t = w.T.reshape(w.shape[1], nk, 2 * dk + 2 * vz)
        q, k, v, z = np.split(t, [dk, 2 * dk, 2 * dk + vz], axis=-1)
        flat = [x.reshape(w.shape[1], -1) for x in (q, k, v, z)]
        layer = name.split(".")[2]
        return {f"blk.{layer}.attn_qkv.weight": np.ascontiguousarray(np.concatenate(flat[:3], axis=1).T),
                f"blk.{layer}.attn_gate.weight": np.ascontiguousarray(flat[3].T)}
    return {name: w}


# gguf arch -> (gguf.MODEL_ARCH member, set_gguf_parameters beyond the shared keys, per-tensor modify_tensors)
ARCHS: dict[str, tuple[str, Callable, Optional[Callable]]] = {
    "deepseek2": ("DEEPSEEK2", deepseek2_keys, lambda n, w, cfg: deepseek2_split_kv_b(n, w, cfg)
                  if n.endswith("kv_b_proj.weight") else {n: w}),
    "glm4moe": ("GLM4_MOE", glm4moe_keys, None),
    "granitehybrid": ("GRANITE_HYBRID", granitehybrid_keys, granitehybrid_modify),
    "gpt-oss": ("GPT_OSS", gpt_oss_keys, gpt_oss_modify),
    "llama4": ("LLAMA4", llama4_keys, llama4_modify),
    "nemotron_h": ("NEMOTRON_H", nemotron_h_keys, nemotron_h_modify),
    "nemotron_h_moe": ("NEMOTRON_H_MOE", nemotron_h_keys, nemotron_h_modify),
    "qwen3next": ("QWEN3NEXT", qwen3next_keys, qwen3next_modify),
}
# the converter adds the prediction layers to block_count (their tensors follow the decoder's blocks)
MTP_LAYERS = {"glm4moe": "num_nextn_predict_layers"}


class _Except:
    """The writer minus the add_* calls of the keys a test sets itself (a key is written once)."""

    def __init__(self, writer, skip: set):
        self.writer, self.skip = writer, skip

    def __getattr__(self, name: str):
        return (lambda *args: None) if name[len("add_"):] in self.skip else getattr(self.writer, name)


def write_llamacpp_gguf(path: str, arch: str, cfg, state: dict, kinds: Optional[dict] = None,
                        extra: Optional[dict] = None) -> dict:
    """Writes `state` (transformers' float32 state dict, lm_head dropped when tied) as llama.cpp's converter
    would; kinds: GGUF name -> block type (quantized with gguf.quants.quantize), F32 otherwise; extra: more
    keys (GGUFWriter add_* name -> value). Returns the GGUF tensors written (float32, before quantizing)."""
    import gguf

    member, keys, modify = ARCHS[arch]
    model_arch = getattr(gguf.MODEL_ARCH, member)
    names = gguf.get_tensor_name_map(model_arch, cfg.num_hidden_layers)
    tensors = {}
    for name, arr in _hf_tensors(state, arch).items():
        for hf_name, w in (modify(name, arr, cfg) if modify else {name: arr}).items():
            new = hf_name if hf_name.startswith("blk.") else names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
            if new is None:
                raise ValueError(f"gguf-py maps no tensor name for {hf_name}")
            tensors[new] = w
    mtp = int(getattr(cfg, MTP_LAYERS[arch], 0) or 0) if arch in MTP_LAYERS else 0
    rng = np.random.default_rng(0)
    for i in range(cfg.num_hidden_layers, cfg.num_hidden_layers + mtp):  # a prediction layer's own tensors
        tensors[f"blk.{i}.nextn.eh_proj.weight"] = rng.standard_normal((cfg.hidden_size, 2 * cfg.hidden_size))
        tensors[f"blk.{i}.attn_norm.weight"] = rng.standard_normal(cfg.hidden_size)
    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[model_arch])
    w.add_block_count(cfg.num_hidden_layers + mtp)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(getattr(cfg, "intermediate_size_mlp", cfg.intermediate_size))
    w.add_head_count(cfg.num_attention_heads)
    w.add_layer_norm_rms_eps(getattr(cfg, "rms_norm_eps", None) or cfg.layer_norm_epsilon)  # Nemotron-H: the latter
    rope = getattr(cfg, "rope_parameters", None) or {}
    if "rope_theta" in rope:
        w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_vocab_size(cfg.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    keys(_Except(w, set(extra or ())), cfg)
    for key, value in (extra or {}).items():
        getattr(w, f"add_{key}")(value)
    for name, arr in tensors.items():
        kind = (kinds or {}).get(name, "F32")
        if kind == "F32":
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
        else:
            qtype = gguf.GGMLQuantizationType[kind]
            w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(arr, np.float32), qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors
