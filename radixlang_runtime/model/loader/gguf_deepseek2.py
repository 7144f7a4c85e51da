"""llama.cpp's `deepseek2` (DeepSeek V2 / V2-Lite / V3, Kimi K2) -> DeepseekV2ForCausalLM / DeepseekV3ForCausalLM.

What llama.cpp's converter (convert_hf_to_gguf.py DeepseekV2Model) writes, undone:
- MLA as MQA: head_count_kv 1, key_length = kv_lora_rank + rope dims, value_length = kv_lora_rank, the head
  sizes in key_length_mla / value_length_mla (older files: head_count_kv = heads, key_length = nope + rope,
  value_length = v_head_dim). kv_b_proj [H (nope + v), C] is attn_kv_b in older files; newer files split it
  per head into attn_k_b [H, C, nope] (transposed) and attn_v_b [H, v, C], joined back here.
- the router: expert_gating_func sigmoid (V3) -> DeepseekV3ForCausalLM with exp_probs_b.bias as
  e_score_correction_bias and groups from expert_group_count / expert_group_used_count; softmax or absent
  (V2's files carry no key) -> DeepseekV2ForCausalLM, greedy top-k (llama.cpp scores groups by their two best
  experts, V2's group_limited_greedy by the best one: a V2 file with groups is refused).
- rope: the weights as stored rotate adjacent pairs (llama.cpp's NORM rope, transformers' rope_interleave);
  yarn's rope.scaling.yarn_log_multiplier is 0.1 * mscale_all_dim (llama.cpp assumes mscale = mscale_all_dim).
"""

from __future__ import annotations

import numpy as np

from radixlang_runtime.model.loader.gguf_family import YARN_BETA_KEYS, GGUFFamily, stacked_experts, yarn_betas

_SOFTMAX, _SIGMOID = 1, 2  # gguf.ExpertGatingFuncType

KEYS = ("leading_dense_block_count", "attention.q_lora_rank", "attention.kv_lora_rank", "attention.key_length_mla",
        "attention.value_length_mla", "expert_count", "expert_used_count", "expert_feed_forward_length",
        "expert_shared_count", "expert_weights_scale", "expert_weights_norm", "expert_gating_func",
        "expert_group_count", "expert_group_used_count")

# DeepSeek V3's MoE block (GLM-4.5's too): the router's correction bias and the shared experts
V3_MOE_NAMES = stacked_experts({
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
})
LAYER_NAMES = {**V3_MOE_NAMES,
    "attn_q_a.weight": "self_attn.q_a_proj.weight", "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight", "attn_q.weight": "self_attn.q_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight", "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
    "attn_k_b.weight": "self_attn.k_b_proj.weight", "attn_v_b.weight": "self_attn.v_b_proj.weight",
}


def _config(a, names: set, base: dict) -> dict:
    heads, layers = base["num_attention_heads"], base["num_hidden_layers"]
    rope, kv_lora = int(a("rope.dimension_count")), int(a("attention.kv_lora_rank"))
    kv_heads = int(a("attention.head_count_kv", heads))
    if a("attention.key_length_mla") is not None:  # MLA as MQA: one latent "head"
        k_head, v_head = int(a("attention.key_length_mla")), int(a("attention.value_length_mla"))
        want = (1, kv_lora + rope, kv_lora)
    else:
        k_head, v_head = int(a("attention.key_length")), int(a("attention.value_length"))
        want = (heads, k_head, v_head)
    got = (kv_heads, int(a("attention.key_length", want[1])), int(a("attention.value_length", want[2])))
    if got != want:
        raise ValueError(f"GGUF deepseek2 attention.head_count_kv / key_length / value_length {got} do not "
                         f"describe MLA (expected {want})")
    gating = int(a("expert_gating_func", _SOFTMAX))
    if gating not in (_SOFTMAX, _SIGMOID):
        raise ValueError(f"GGUF deepseek2.expert_gating_func {gating} is not supported (softmax, sigmoid)")
    groups, groups_used = int(a("expert_group_count", 1)), int(a("expert_group_used_count", 1))
    q_lora = a("attention.q_lora_rank")
    out = {k: v for k, v in base.items() if k not in ("head_dim", "partial_rotary_factor")}
    out.update(num_key_value_heads=heads, kv_lora_rank=kv_lora, q_lora_rank=None if q_lora is None else int(q_lora),
               qk_rope_head_dim=rope, qk_nope_head_dim=k_head - rope, v_head_dim=v_head,
               n_routed_experts=int(a("expert_count")), num_experts_per_tok=int(a("expert_used_count")),
               moe_intermediate_size=int(a("expert_feed_forward_length")),
               n_shared_experts=int(a("expert_shared_count", 0)),
               first_k_dense_replace=int(a("leading_dense_block_count", 0)),
               routed_scaling_factor=float(a("expert_weights_scale", 1.0)),
               norm_topk_prob=bool(a("expert_weights_norm", False)))
    if "rope_scaling" in out:
        out["rope_scaling"] = _yarn(a, out["rope_scaling"])
    if gating == _SIGMOID:
        need_correction_bias("deepseek2", names, out["first_k_dense_replace"], layers)
        out.update(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", scoring_func="sigmoid",
                   topk_method="noaux_tc", n_group=groups, topk_group=groups_used, rope_interleave=True)
        return out
    if groups > 1:
        raise ValueError(f"GGUF deepseek2.expert_group_count {groups} with softmax gating is not supported "
                         "(llama.cpp scores a group by its two best experts, DeepSeek V2 by its best one)")
    out.update(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", scoring_func="softmax",
               topk_method="greedy")
    return out


def need_correction_bias(arch: str, names: set, first: int, layers: int) -> None:
    """DeepseekV3's router always adds e_score_correction_bias: every MoE layer must carry exp_probs_b.bias."""
    missing = [i for i in range(first, layers) if f"blk.{i}.exp_probs_b.bias" not in names]
    if missing:
        raise ValueError(f"GGUF {arch} with sigmoid gating needs blk.{missing[0]}.exp_probs_b.bias")


def _yarn(a, scaling: dict) -> dict:
    """yarn with DeepSeek's attention scale: mscale = mscale_all_dim = yarn_log_multiplier / 0.1."""
    if scaling.get("rope_type") != "yarn":
        raise ValueError(f"GGUF deepseek2 rope scaling {scaling.get('rope_type')!r} is not supported (yarn)")
    mul = a("rope.scaling.yarn_log_multiplier")
    out = yarn_betas(a, scaling)
    if mul is not None:  # (the key is a float32: 0.1 * m rounded back to m's digits)
        m = round(float(mul) / 0.1, 6)
        out.update(mscale=m, mscale_all_dim=m)
    return out


def _tensors(out: dict, config: dict) -> None:
    """attn_k_b [H, C, nope] + attn_v_b [H, v, C] -> kv_b_proj [H (nope + v), C], in place."""
    for name in [n for n in out if n.endswith("self_attn.k_b_proj.weight")]:
        k_b = out.pop(name)
        v_b = out.pop(name.replace("k_b_proj", "v_b_proj"))
        heads, kv_lora = config["num_attention_heads"], config["kv_lora_rank"]
        k_b = k_b.reshape(heads, kv_lora, -1).transpose(0, 2, 1)
        v_b = v_b.reshape(heads, -1, kv_lora)
        joined = np.concatenate([k_b, v_b], axis=1).reshape(-1, kv_lora)
        out[name.replace("k_b_proj", "kv_b_proj")] = np.ascontiguousarray(joined)


FAMILY = GGUFFamily(arch="deepseek2", hf_arch="DeepseekV3ForCausalLM", model_type="deepseek_v3", keys=KEYS,
                    layer_names=LAYER_NAMES, config=_config, tensors=_tensors, head_dims=True,
                    rope_scaling_keys=("yarn_log_multiplier",) + YARN_BETA_KEYS)
