"""llama.cpp's `glm4moe` (GLM-4.5 / 4.5-Air / 4.6) -> Glm4MoeForCausalLM.

What llama.cpp's converter (convert_hf_to_gguf.py Glm4MoeModel) writes, undone: q / k / v as they are (neox
halves: no permutation), the pre-FFN norm as post_attention_norm, partial rotary as rope.dimension_count
(head_dim / 2), DeepSeek V3's MoE block (sigmoid router, exp_probs_b.bias, grouped top-k, shared experts,
leading dense layers), and the multi-token-prediction layers appended after the decoder
(nextn_predict_layers: block_count counts them; their blk.N tensors are left unread, as a plain forward never
runs them).
"""

from __future__ import annotations

from radixlang_runtime.model.loader.gguf_deepseek2 import V3_MOE_NAMES, need_correction_bias
from radixlang_runtime.model.loader.gguf_family import GGUFFamily

_SIGMOID = 2  # gguf.ExpertGatingFuncType

KEYS = ("leading_dense_block_count", "expert_count", "expert_used_count", "expert_feed_forward_length",
        "expert_shared_count", "expert_weights_scale", "expert_weights_norm", "expert_gating_func",
        "expert_group_count", "expert_group_used_count", "nextn_predict_layers")


def _config(a, names: set, base: dict) -> dict:
    gating = a("expert_gating_func", _SIGMOID)
    if int(gating) != _SIGMOID:
        raise ValueError(f"GGUF glm4moe.expert_gating_func {gating} is not supported (sigmoid)")
    nextn = int(a("nextn_predict_layers", 0))
    layers = base["num_hidden_layers"] - nextn  # block_count counts the appended prediction layers
    out = dict(base, num_hidden_layers=layers, num_nextn_predict_layers=nextn,
               n_routed_experts=int(a("expert_count")), num_experts_per_tok=int(a("expert_used_count")),
               moe_intermediate_size=int(a("expert_feed_forward_length")),
               n_shared_experts=int(a("expert_shared_count", 0)),
               first_k_dense_replace=int(a("leading_dense_block_count", 0)),
               routed_scaling_factor=float(a("expert_weights_scale", 1.0)),
               norm_topk_prob=bool(a("expert_weights_norm", False)),
               n_group=int(a("expert_group_count", 1)), topk_group=int(a("expert_group_used_count", 1)),
               use_qk_norm="blk.0.attn_q_norm.weight" in names, scoring_func="sigmoid", topk_method="noaux_tc")
    out.setdefault("partial_rotary_factor", 1.0)  # rope.dimension_count == head_dim: the whole head rotates
    need_correction_bias("glm4moe", names, out["first_k_dense_replace"], layers)
    return out


FAMILY = GGUFFamily(arch="glm4moe", hf_arch="Glm4MoeForCausalLM", model_type="glm4_moe", keys=KEYS,
                    layer_names={**V3_MOE_NAMES, "post_attention_norm.weight": "post_attention_layernorm.weight"},
                    config=_config, extra_blocks=True)
