"""What llama.cpp's convert_hf_to_gguf.py does to the Mamba2 hybrids' checkpoints, for gguf_llamacpp.py: the metadata
keys (set_gguf_parameters) and the per-tensor changes (filter_tensors / modify_tensors) of GraniteHybridModel
(with Mamba2Model's and GraniteMoeModel's) and NemotronHModel. The tensor names come from gguf-py's map, as in the
converter."""

from __future__ import annotations

import numpy as np

from gguf_tiny import permute


def _granite_attention(cfg) -> list[int]:
    return [i for i, t in enumerate(cfg.layer_types) if t in ("attention", "full_attention")]


def granitehybrid_keys(w, cfg) -> None:
    """GraniteHybridModel.set_gguf_parameters (GraniteMoeModel's, then the Mamba2 sizes and the per-layer KV heads,
    0 on a Mamba2 layer); rope off (rope.scaling.finetuned false, context 2 ** 20) for a hybrid."""
    w.add_expert_count(cfg.num_local_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_attention_scale(cfg.attention_multiplier)
    w.add_embedding_scale(cfg.embedding_multiplier)
    w.add_residual_scale(cfg.residual_multiplier)
    w.add_logit_scale(cfg.logits_scaling)
    w.add_expert_shared_feed_forward_length(cfg.shared_intermediate_size)
    w.add_ssm_conv_kernel(cfg.mamba_d_conv)
    w.add_ssm_state_size(cfg.mamba_d_state)
    w.add_ssm_group_count(cfg.mamba_n_groups)
    w.add_ssm_inner_size(cfg.mamba_n_heads * cfg.mamba_d_head)
    w.add_ssm_time_step_rank(cfg.mamba_n_heads)
    attention = _granite_attention(cfg)
    w.add_head_count_kv([cfg.num_key_value_heads if i in attention else 0 for i in range(cfg.num_hidden_layers)])
    use_rope = len(attention) == cfg.num_hidden_layers  # "BambaForCausalLM" or no Mamba2 layer
    w.add_rope_scaling_finetuned(use_rope)
    if not use_rope:
        w.add_context_length(2 ** 20)


def _mamba2_layout(name: str, w: np.ndarray, prefix: str, groups: int) -> dict[str, np.ndarray] | None:
    """A Mamba2 tensor as llama.cpp's Mamba2Model writes it (None: not one): dt_bias as dt_proj.bias, the conv1d
    squeezed, A_log as A = -exp(A_log) [H, 1], D [H, 1], the norm [groups, n]."""
    if name.endswith(".dt_bias"):
        return {name.replace(".dt_bias", ".dt_proj.bias"): w}
    if "conv1d" in name:
        return {name: np.ascontiguousarray(w.squeeze())}
    if name.endswith(".A_log"):
        return {name: (-np.exp(w.astype(np.float64))).astype(np.float32).reshape(-1, 1)}
    if name.endswith(prefix + "D"):
        return {name: w.reshape(-1, 1)}
    if name.endswith(prefix + "norm.weight"):
        return {name: w.reshape(groups, -1)}
    return None


def granitehybrid_modify(name: str, w: np.ndarray, cfg) -> dict[str, np.ndarray]:
    """The hub checkpoint's names (block_sparse_moe.input_linear / output_linear / router.layer) from transformers
    5's, then GraniteMoeModel.modify_tensors (input_linear split into gate / up rows), Mamba2Model's (dt_bias
    renamed, conv1d squeezed, A and D [H, 1], A = -exp(A_log), the norm [groups, inner / groups]) and LlamaModel's
    q / k permutation (undo_permute)."""
    layer = name.split(".")[2] if name.startswith("model.layers.") else None
    if name == "lm_head.weight" and cfg.tie_word_embeddings:  # not in the hub checkpoint
        return {}
    if name.endswith("block_sparse_moe.experts.gate_up_proj"):  # input_linear [E, 2I, hidden]
        gate, up = np.split(w, 2, axis=-2)
        return {f"blk.{layer}.ffn_gate_exps.weight": gate, f"blk.{layer}.ffn_up_exps.weight": up}
    if name.endswith("block_sparse_moe.experts.down_proj"):
        return {name.replace("experts.down_proj", "output_linear.weight"): w}
    if name.endswith("block_sparse_moe.router.weight"):
        return {name.replace("router.weight", "router.layer.weight"): w}
    if name.endswith("shared_mlp.input_linear.weight"):
        gate, up = np.split(w, 2, axis=-2)
        kind = "_shexp" if cfg.num_local_experts else ""  # the shared expert, or the dense MLP
        return {f"blk.{layer}.ffn_gate{kind}.weight": gate, f"blk.{layer}.ffn_up{kind}.weight": up}
    if name.endswith("shared_mlp.output_linear.weight") and not cfg.num_local_experts:
        return {f"blk.{layer}.ffn_down.weight": w}
    if (mamba := _mamba2_layout(name, w, "mamba.", cfg.mamba_n_groups)) is not None:
        return mamba
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return {name: permute(w, cfg.num_attention_heads)}
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return {name: permute(w, cfg.num_key_value_heads)}
    return {name: w}


_NEMOTRON_PATTERN = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*", "mlp": "-",
                     "moe": "E"}


def nemotron_h_keys(w, cfg) -> None:
    """NemotronHModel.set_gguf_parameters on GraniteHybridModel's: the Mamba2 sizes (inner = mamba_num_heads x
    mamba_head_dim), KV heads per layer (0 off the attention blocks), no rope (finetuned false, context 2 ** 20),
    the head size, the feed-forward width per layer (0 off the MLP / MoE blocks); a file with experts (the
    hub config names num_experts_per_tok) is nemotron_h_moe, with the MoE's keys; both epsilon keys (the hub
    config's rms_norm_eps and layer_norm_epsilon)."""
    types = [_NEMOTRON_PATTERN[t] for t in cfg.layers_block_type]
    moe = "E" in types
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    w.add_ssm_conv_kernel(cfg.conv_kernel)
    w.add_ssm_state_size(cfg.ssm_state_size)
    w.add_ssm_group_count(cfg.n_groups)
    w.add_ssm_inner_size(cfg.mamba_num_heads * cfg.mamba_head_dim)
    w.add_ssm_time_step_rank(cfg.mamba_num_heads)
    w.add_head_count_kv([cfg.num_key_value_heads if t == "*" else 0 for t in types])
    w.add_rope_scaling_finetuned(False)
    w.add_context_length(2 ** 20)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    ff = cfg.moe_intermediate_size if moe else cfg.intermediate_size
    w.add_feed_forward_length([ff if t == ("E" if moe else "-") else 0 for t in types])
    if not moe:
        return
    w.add_expert_count(cfg.n_routed_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_group_count(cfg.n_group)
    w.add_expert_group_used_count(cfg.topk_group)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_shared_feed_forward_length(cfg.moe_shared_expert_intermediate_size)
    w.add_expert_shared_count(cfg.n_shared_experts)
    w.add_expert_weights_norm(cfg.norm_topk_prob)
    w.add_expert_weights_scale(cfg.routed_scaling_factor)
    if cfg.moe_latent_size is not None:
        w.add_moe_latent_size(cfg.moe_latent_size)


def nemotron_h_modify(name: str, w: np.ndarray, cfg) -> dict[str, np.ndarray]:
    """The hub checkpoint's backbone.* names from transformers 5's model.*, then NemotronHModel / Mamba2Model's
    changes (dt_bias renamed, conv1d squeezed, A = -exp(A_log) and D as [H, 1], the norm [groups, inner /
    groups]), the experts stacked per layer (ffn_up_exps / ffn_down_exps), the correction bias renamed, and the
    attention blocks' q / k permutation (undo_permute)."""
    name = "backbone." + name[len("model."):] if name.startswith("model.") else name
    layer = name.split(".")[2] if name.startswith("backbone.layers.") else None
    if name.endswith("mixer.experts.up_proj"):
        return {f"blk.{layer}.ffn_up_exps.weight": w}
    if name.endswith("mixer.experts.down_proj"):
        return {f"blk.{layer}.ffn_down_exps.weight": w}
    if name.endswith("e_score_correction_bias"):
        return {name.replace("e_score_correction_bias", "e_score_correction.bias"): w}
    if (mamba := _mamba2_layout(name, w, "mixer.", cfg.n_groups)) is not None:
        return mamba
    if name.endswith("q_proj.weight"):
        return {name: permute(w, cfg.num_attention_heads)}
    if name.endswith("k_proj.weight"):
        return {name: permute(w, cfg.num_key_value_heads)}
    return {name: w}
