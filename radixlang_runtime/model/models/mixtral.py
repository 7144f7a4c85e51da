"""Mixtral (MixtralForCausalLM): the Llama decoder with a top-k MoE block in every layer (model/layers/moe.py).

Routing as transformers' MixtralTopKRouter: softmax in float32, top-k, always renormalised over the k, the
expert outputs scaled by the float32 weights. The hub's checkpoints name the block block_sparse_moe and the
experts' gate / up / down w1 / w3 / w2.
"""

from __future__ import annotations

import dataclasses

from radixlang_runtime.model.loader.config import ModelConfig, base_config
from radixlang_runtime.model.models.moe_decoder import MoEForCausalLM
from radixlang_runtime.model.layers.moe_spec import parse_moe

__all__ = ["MoEForCausalLM", "parse_mixtral"]

# transformers' MixtralConfig defaults for the fields base_config reads
_DEFAULTS = {"intermediate_size": 14336, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096 * 32,
             "rope_theta": 1e6}


def parse_mixtral(cfg: dict) -> ModelConfig:
    arch = "MixtralForCausalLM"
    cfg = {**_DEFAULTS, **cfg}
    window = cfg.get("sliding_window")  # every layer (None: none)
    out = base_config(cfg, arch, attention_bias=False, qk_norm=False,
                      sliding_window=None if window is None else int(window))
    moe = parse_moe(cfg, arch, experts_key="num_local_experts", default_experts=8, default_top_k=2,
                    inter_key="intermediate_size", default_inter=14336, norm_topk_prob=True, weights_float32=True,
                    block="block_sparse_moe", expert_names=("w1", "w3", "w2"))
    return dataclasses.replace(out, moe=moe)
