"""GLM-4.5 MoE (Glm4MoeForCausalLM): the Llama decoder (GQA, q/k/v bias with attention_bias, q / k RMSNorm per
head with use_qk_norm, partial rotary: neox halves of the leading partial_rotary_factor of each head, 0.5 when
config.json gives none, as transformers' Glm4MoeConfig) with DeepSeek V3's MoE blocks: the sigmoid router with
e_score_correction_bias and grouped top-k (model/layers/moe_routing.py), shared experts, dense MLPs in the layers
before first_k_dense_replace. The multi-token-prediction layer of the hub checkpoints (num_nextn_predict_layers)
is not run by a plain forward; its tensors are left unread (speculative NEXTN runs it: models/nextn.py).
"""

from __future__ import annotations

from radixlang_runtime.model.loader.config import ModelConfig, base_config
from radixlang_runtime.model.models.moe_decoder import MoEForCausalLM
from radixlang_runtime.model.models.deepseek import deepseek_moe, v3_routing

__all__ = ["MoEForCausalLM", "parse_glm4_moe"]

DEFAULTS = {"vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 10944, "num_hidden_layers": 46,
            "num_attention_heads": 96, "num_key_value_heads": 8, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5, "moe_intermediate_size": 1408, "num_experts_per_tok": 8, "n_shared_experts": 1,
            "n_routed_experts": 128, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
            "first_k_dense_replace": 1, "norm_topk_prob": True}


def parse_glm4_moe(cfg: dict) -> ModelConfig:
    arch = "Glm4MoeForCausalLM"
    cfg = {**DEFAULTS, **cfg}
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if "partial_rotary_factor" not in cfg and "partial_rotary_factor" not in rope:
        cfg["partial_rotary_factor"] = 0.5  # Glm4MoeConfig's default
    for key in ("scoring_func", "topk_method"):  # what the original configs say; the router is V3's
        want = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}[key]
        if cfg.get(key, want) != want:
            raise ValueError(f"{key} {cfg[key]!r} is not supported ({arch}: {want})")
    out = base_config(cfg, arch, attention_bias=bool(cfg.get("attention_bias", False)),
                      qk_norm=bool(cfg.get("use_qk_norm", False)), sliding_window=None, partial_rotary=True)
    return deepseek_moe(cfg, arch, v3_routing(cfg, arch), out)
