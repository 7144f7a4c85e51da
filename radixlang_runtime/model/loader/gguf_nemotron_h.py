"""llama.cpp's `nemotron_h` (Nemotron-H, Nemotron Nano 2) and `nemotron_h_moe` (Nemotron 3) -> NemotronHForCausalLM.

What llama.cpp's converter (convert_hf_to_gguf.py NemotronHModel on GraniteHybridModel / Mamba2Model) writes,
undone:
- the block pattern in two per-layer arrays, as llama.cpp reads it: attention.head_count_kv > 0 an attention
  block, feed_forward_length > 0 a feed-forward block (relu^2 MLP in `nemotron_h`, MoE in `nemotron_h_moe`: every
  feed-forward block of a file with experts is MoE), both 0 a Mamba2 block;
- Mamba2 as for granitehybrid (gguf_granitehybrid.py): ssm_a = -exp(A_log) and ssm_d [heads, 1], ssm_dt.bias,
  ssm_conv1d [channels, kernel], ssm_norm [groups, inner / groups], the sizes in ssm.*;
- attention: q / k rows permuted as llama's (the converter's undo_permute; the blocks have no positions), head
  size in attention.key_length; no rope (context_length 2 ** 20);
- the MoE: stacked non-gated experts (ffn_up_exps [E, I, latent], ffn_down_exps), ffn_gate_inp, exp_probs_b.bias
  (the correction bias), the shared expert (ffn_up_shexp / ffn_down_shexp), the latent projections
  (ffn_latent_down / ffn_latent_up, moe_latent_size), sigmoid routing with expert_weights_norm /
  expert_weights_scale and the groups (expert_group_count / expert_group_used_count);
- the norms' epsilon in attention.layer_norm_rms_epsilon (else attention.layer_norm_epsilon, the config's
  layer_norm_epsilon, which the converter writes too).

Prediction blocks appended after the decoder (nextn_predict_layers) are left unread, as transformers leaves mtp.*.
The converted directory carries transformers 5's names (model.embeddings, model.layers.N.mixer.*, model.norm_f).
"""

from __future__ import annotations


from radixlang_runtime.model.loader.gguf_family import GGUFFamily, check_blocks, undo_mamba2_hybrid

_SIGMOID = 2  # gguf.ExpertGatingFuncType
KEYS = ("ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size",
        "attention.layer_norm_epsilon", "nextn_predict_layers")
MOE_KEYS = KEYS + ("expert_count", "expert_used_count", "expert_feed_forward_length",
                   "expert_shared_feed_forward_length", "expert_shared_count", "expert_weights_norm",
                   "expert_weights_scale", "expert_gating_func", "expert_group_count", "expert_group_used_count",
                   "moe_latent_size")
_X = "mixer."
LAYER_NAMES = {
    "attn_norm.weight": "norm.weight",
    "ssm_in.weight": _X + "in_proj.weight", "ssm_in.bias": _X + "in_proj.bias",
    "ssm_conv1d.weight": _X + "conv1d.weight", "ssm_conv1d.bias": _X + "conv1d.bias",
    "ssm_dt.bias": _X + "dt_bias", "ssm_a": _X + "A_log", "ssm_d": _X + "D", "ssm_norm.weight": _X + "norm.weight",
    "ssm_out.weight": _X + "out_proj.weight", "ssm_out.bias": _X + "out_proj.bias",
    "attn_q.weight": _X + "q_proj.weight", "attn_k.weight": _X + "k_proj.weight",
    "attn_v.weight": _X + "v_proj.weight", "attn_output.weight": _X + "o_proj.weight",
    "ffn_up.weight": _X + "up_proj.weight", "ffn_up.bias": _X + "up_proj.bias",
    "ffn_down.weight": _X + "down_proj.weight", "ffn_down.bias": _X + "down_proj.bias",
    "ffn_gate_inp.weight": _X + "gate.weight", "exp_probs_b.bias": _X + "gate.e_score_correction_bias",
    "ffn_up_exps.weight": _X + "experts.up_proj", "ffn_down_exps.weight": _X + "experts.down_proj",
    "ffn_up_shexp.weight": _X + "shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": _X + "shared_experts.down_proj.weight",
    "ffn_latent_down.weight": _X + "fc1_latent_proj.weight", "ffn_latent_up.weight": _X + "fc2_latent_proj.weight",
}


def _per_layer(a, key: str, n: int, default: int) -> list[int]:
    value = a(key)
    return [int(v) for v in value][:n] if isinstance(value, list) else [int(default)] * n


def _config(a, names: set, base: dict, moe: bool) -> dict:
    arch = "nemotron_h_moe" if moe else "nemotron_h"
    layers = base["num_hidden_layers"] - int(a("nextn_predict_layers", 0))
    kv = _per_layer(a, "attention.head_count_kv", layers, base["num_key_value_heads"])
    ff = _per_layer(a, "feed_forward_length", layers, base["intermediate_size"])
    types = ["full_attention" if k else ("moe" if moe else "mlp") if f else "linear_attention" for k, f in zip(kv, ff)]
    check_blocks(arch, types, names, {"linear_attention": "ssm_in.weight", "full_attention": "attn_q.weight",
                                      "mlp": "ffn_up.weight", "moe": "ffn_up_exps.weight"})
    heads, inner = int(a("ssm.time_step_rank")), int(a("ssm.inner_size"))
    if inner % heads:
        raise ValueError(f"GGUF {arch}.ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {heads}")
    first = {t: next((i for i, u in enumerate(types) if u == t), 0) for t in ("linear_attention", "full_attention")}
    m, att = first["linear_attention"], first["full_attention"]
    eps = a("attention.layer_norm_rms_epsilon", a("attention.layer_norm_epsilon", 1e-5))
    drop = ("rope_theta", "rope_scaling", "partial_rotary_factor", "rms_norm_eps", "attention_bias")
    out = {k: v for k, v in base.items() if k not in drop}
    out.update(num_hidden_layers=layers, layers_block_type=types, layer_norm_epsilon=float(eps),
               mlp_hidden_act="relu2",
               attention_bias=f"blk.{att}.attn_q.bias" in names,
               mlp_bias=any(f"blk.{i}.ffn_up.bias" in names for i in range(layers)),
               mamba_num_heads=heads, mamba_head_dim=inner // heads, ssm_state_size=int(a("ssm.state_size")),
               n_groups=int(a("ssm.group_count")), conv_kernel=int(a("ssm.conv_kernel")),
               use_conv_bias=f"blk.{m}.ssm_conv1d.bias" in names, use_bias=f"blk.{m}.ssm_in.bias" in names)
    if "mlp" in types:
        out["intermediate_size"] = max(f for f, t in zip(ff, types) if t == "mlp")
    elif out.get("intermediate_size") is None:
        out.pop("intermediate_size", None)
    if moe:
        gating = int(a("expert_gating_func", _SIGMOID))
        if gating != _SIGMOID:
            raise ValueError(f"GGUF {arch}.expert_gating_func {gating} is not supported (sigmoid, as llama.cpp "
                             "routes Nemotron-H)")
        latent = a("moe_latent_size")
        out.update(n_routed_experts=int(a("expert_count")), num_experts_per_tok=int(a("expert_used_count")),
                   moe_intermediate_size=int(a("expert_feed_forward_length")),
                   moe_shared_expert_intermediate_size=int(a("expert_shared_feed_forward_length")),
                   n_shared_experts=int(a("expert_shared_count", 1)),
                   norm_topk_prob=bool(a("expert_weights_norm", False)),
                   routed_scaling_factor=float(a("expert_weights_scale", 1.0)),
                   n_group=int(a("expert_group_count", 1)), topk_group=int(a("expert_group_used_count", 1)),
                   moe_latent_size=None if not latent else int(latent))
    return out


def _tensors(out: dict, config: dict) -> None:
    """The global names, q / k rows unpermuted, ssm_a -> A_log, D / A [H, 1] -> [H], conv1d [C, K] -> [C, 1, K],
    the grouped norm flattened; in place."""
    out["model.embeddings.weight"] = out.pop("model.embed_tokens.weight")
    out["model.norm_f.weight"] = out.pop("model.norm.weight")
    undo_mamba2_hybrid(out, config, _X, _X)


FAMILY = GGUFFamily(arch="nemotron_h", hf_arch="NemotronHForCausalLM", model_type="nemotron_h", keys=KEYS,
                    layer_names=LAYER_NAMES, config=lambda a, n, b: _config(a, n, b, False), tensors=_tensors,
                    per_layer=True, extra_blocks=True)
MOE_FAMILY = GGUFFamily(arch="nemotron_h_moe", hf_arch="NemotronHForCausalLM", model_type="nemotron_h",
                        keys=MOE_KEYS, layer_names=LAYER_NAMES, config=lambda a, n, b: _config(a, n, b, True),
                        tensors=_tensors, per_layer=True, extra_blocks=True)
