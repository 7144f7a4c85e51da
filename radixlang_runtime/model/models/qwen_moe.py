"""Qwen2-MoE (Qwen2MoeForCausalLM) and Qwen3-MoE (Qwen3MoeForCausalLM): the Llama decoder with MoE blocks
(model/layers/moe.py) in the layers decoder_sparse_step / mlp_only_layers select, dense MLPs elsewhere.

Qwen2-MoE: q/k/v bias (qkv_bias), a shared expert scaled by sigmoid(shared_expert_gate); Qwen3-MoE: q/k
RMSNorm per head. Both: norm_topk_prob, routing weights rounded to the model dtype before the scaling.
"""

from __future__ import annotations

import dataclasses

from radixlang_runtime.model.loader.config import ModelConfig, base_config, layer_windows
from radixlang_runtime.model.models.moe_decoder import MoEForCausalLM
from radixlang_runtime.model.layers.moe_spec import parse_moe, qwen_sparse_layers

__all__ = ["MoEForCausalLM", "parse_qwen2_moe", "parse_qwen3_moe"]


def parse_qwen2_moe(cfg: dict) -> ModelConfig:
    arch = "Qwen2MoeForCausalLM"
    cfg = {"intermediate_size": 5632, "max_position_embeddings": 32768, **cfg}  # Qwen2MoeConfig defaults
    # transformers' Qwen2MoeConfig: with use_sliding_window, the even layers below max_window_layers slide
    window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window", False) else None
    first = cfg.get("max_window_layers", 28)
    default = ["sliding_attention" if window is not None and i % 2 == 0 and i < first else "full_attention"
               for i in range(cfg["num_hidden_layers"])]
    out = base_config(cfg, arch, attention_bias=bool(cfg.get("qkv_bias", True)), qk_norm=False,
                      sliding_window=None, windows=layer_windows(cfg, arch, window, default))
    experts = int(cfg.get("num_experts", 60))
    moe = parse_moe(cfg, arch, experts_key="num_experts", default_experts=60, default_top_k=4,
                    inter_key="moe_intermediate_size", default_inter=1408,
                    norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                    shared_intermediate_size=int(cfg.get("shared_expert_intermediate_size", 5632)),
                    sparse_layers=qwen_sparse_layers(cfg, experts))
    return dataclasses.replace(out, moe=moe)


def parse_qwen3_moe(cfg: dict) -> ModelConfig:
    arch = "Qwen3MoeForCausalLM"
    cfg = {"intermediate_size": 6144, "max_position_embeddings": 32768, **cfg}  # Qwen3MoeConfig defaults
    window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window", False) else None  # every layer
    out = base_config(cfg, arch, attention_bias=bool(cfg.get("attention_bias", False)), qk_norm=True,
                      sliding_window=None if window is None else int(window))
    key = "num_experts" if "num_experts" in cfg else "num_local_experts"  # the config's attribute_map
    experts = int(cfg.get(key, 128))
    moe = parse_moe(cfg, arch, experts_key=key, default_experts=128, default_top_k=8,
                    inter_key="moe_intermediate_size", default_inter=768,
                    norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                    sparse_layers=qwen_sparse_layers(cfg, experts))
    return dataclasses.replace(out, moe=moe)
