"""OLMoE (OlmoeForCausalLM): the Llama decoder with a top-k MoE block in every layer (model/layers/moe.py), q and k
RMSNorm'd over the whole projection ([H D] and [Hkv D] weights, statistics across heads: unlike Qwen3's per
head) and, with clip_qkv, q / k / v clamped to [-clip_qkv, clip_qkv] after the norm.
"""

from __future__ import annotations

import dataclasses

from radixlang_runtime.model.loader.config import ModelConfig, base_config
from radixlang_runtime.model.models.moe_decoder import MoEForCausalLM
from radixlang_runtime.model.layers.moe_spec import parse_moe

__all__ = ["MoEForCausalLM", "parse_olmoe"]

_DEFAULTS = {"intermediate_size": 2048, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096}


def parse_olmoe(cfg: dict) -> ModelConfig:
    arch = "OlmoeForCausalLM"
    cfg = {**_DEFAULTS, **cfg}
    if cfg.get("head_dim") not in (None, cfg["hidden_size"] // cfg["num_attention_heads"]):
        # transformers sizes q_norm by hidden_size: the heads must tile it
        raise ValueError(f"head_dim {cfg['head_dim']} is not supported ({arch}: hidden_size / num_attention_heads)")
    # OlmoeAttention passes config.sliding_window to the attention function, but OlmoeModel builds a plain
    # causal mask: the window would act under flash attention only. Which one a user means is unclear, so a
    # window shorter than the context is refused by name (a longer one never masks anything).
    window = cfg.get("sliding_window")
    out = base_config(cfg, arch, attention_bias=bool(cfg.get("attention_bias", False)), qk_norm=False,
                      sliding_window=None)
    if window is not None:
        out = dataclasses.replace(out, max_context=int(window), max_context_reason=(
            f"sliding_window {window} ({arch}: transformers applies it under flash attention only)"))
    clip = cfg.get("clip_qkv")
    key = "num_experts" if "num_experts" in cfg else "num_local_experts"
    moe = parse_moe(cfg, arch, experts_key=key, default_experts=64, default_top_k=8, inter_key="intermediate_size",
                    default_inter=2048, norm_topk_prob=bool(cfg.get("norm_topk_prob", False)))
    return dataclasses.replace(out, moe=moe, qk_norm_whole=True, clip_qkv=None if clip is None else float(clip))
