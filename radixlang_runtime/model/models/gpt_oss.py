"""gpt-oss (GptOssForCausalLM): the Llama decoder with attention sinks, biased projections and a biased
top-k MoE with the clamped SwiGLU in every layer.

What differs from Llama, each as transformers' GptOss code computes it:
- q / k / v / o projections with biases (attention_bias, default true); the o bias is added after the
  all-reduce (every rank holds it);
- attention sinks: a learned logit per query head in every softmax's denominator (GptOssAttention.sinks),
  run by the attention backend (AttentionBackend.set_sinks; the torch backend on every path it takes);
- alternating sliding-window / full layers (layer_types; default: even layers slide, sliding_window 128);
- RoPE: yarn x32 over 4,096 original positions, theta 150,000 by default;
- the MoE block (model/layers/moe.py with MoESpec's gpt-oss fields): router linear with a bias, softmax over the
  top-k logits, experts' gate_up [E, hidden, 2I] with gate and up interleaved (even / odd columns) plus a
  bias, the clamped SwiGLU (swiglu_limit, swiglu_alpha), down [E, I, hidden] plus a bias.

Checkpoints: transformers' names (model.layers.{i}.mlp.router.*, .mlp.experts.gate_up_proj[_bias],
.down_proj[_bias], .self_attn.sinks) in float32 / bfloat16 / float16. The hub's MXFP4 checkpoints carry a
quantization_config and are refused by name (config.refuse_common).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch
from torch import nn

from radixlang_runtime.model.layers.attention.base import AttentionBackend
from radixlang_runtime.model.loader.config import ModelConfig, base_config, layer_windows
from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.models.llama import Attention, Reduce
from radixlang_runtime.model.layers.moe import SparseMoE
from radixlang_runtime.model.models.moe_decoder import MoEForCausalLM
from radixlang_runtime.model.layers.moe_spec import parse_moe
from radixlang_runtime.model.executor.parallel import Shard
from radixlang_runtime.model.loader.weights import SafetensorsDir

__all__ = ["GptOssForCausalLM", "parse_gpt_oss"]

ARCH = "GptOssForCausalLM"
# transformers' GptOssConfig defaults for the fields read here
_DEFAULTS = {"num_hidden_layers": 36, "num_local_experts": 128, "vocab_size": 201088, "hidden_size": 2880,
             "intermediate_size": 2880, "head_dim": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
             "sliding_window": 128, "tie_word_embeddings": False, "max_position_embeddings": 131072,
             "rms_norm_eps": 1e-5, "num_experts_per_tok": 4, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
             "attention_bias": True, "rope_theta": 150000.0}
_DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                 "original_max_position_embeddings": 4096}


class GptOssAttention(Attention):
    """Llama's attention plus the sinks ([H_rank]: this rank's query heads) and the o projection's bias."""

    def __init__(self, cfg: ModelConfig, layer_id: int, backend: AttentionBackend, shard: Shard, reduce: Reduce):
        super().__init__(cfg, layer_id, backend, shard, reduce)
        self.sinks = nn.Parameter(torch.empty(self.h))
        self.o_bias = nn.Parameter(torch.empty(cfg.hidden_size)) if cfg.attention_bias else None

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        out = super().forward(x, fb)  # [T, hidden], summed over the ranks
        return out if self.o_bias is None else out + self.o_bias


class GptOssForCausalLM(MoEForCausalLM):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, rotary, shard: Optional[Shard] = None,
                 reduce: Reduce = None):
        super().__init__(cfg, backend, rotary, shard, reduce)
        for i, layer in enumerate(self.layers):
            layer.self_attn = GptOssAttention(cfg, i, backend, self.shard, reduce)

    reads_o_proj_bias = True

    def load_hf_state_dict(self, tensors: SafetensorsDir) -> None:
        super().load_hf_state_dict(tensors)
        for layer in self.layers:  # the backend reads each layer's sinks from here on
            attn: GptOssAttention = layer.self_attn
            attn.backend.set_sinks(attn.layer_id, attn.sinks)

    def load_layer_extras(self, i: int, tensors, put: Callable[[str, torch.Tensor], None]) -> None:
        sh, a = self.shard, f"model.layers.{i}.self_attn."
        put(f"layers.{i}.self_attn.sinks", tensors.get(a + "sinks", rows=(sh.q_start, sh.q_start + sh.q_count)))
        if self.cfg.attention_bias:
            put(f"layers.{i}.self_attn.o_bias", tensors.get(a + "o_proj.bias"))

    def load_mlp(self, i: int, tensors: SafetensorsDir, put: Callable[[str, torch.Tensor], None]) -> None:
        """gate_up [E, hidden, 2I] (gate, up interleaved by column) -> this rank's [E, 2 I_rank, hidden]
        (gate rows, then up rows); down [E, I, hidden] -> [E, hidden, I_rank]; biases alike."""
        block: SparseMoE = self.layers[i].mlp
        src, dst = f"model.layers.{i}.mlp.", f"layers.{i}.mlp."
        c0, c1 = block.inter_start, block.inter_start + block.inter
        put(dst + "router", tensors.get(src + "router.weight"))
        put(dst + "router_bias", tensors.get(src + "router.bias"))
        gu = tensors.get(src + "experts.gate_up_proj")  # [E, hidden, 2I]
        gate, up = gu[:, :, 0::2][:, :, c0:c1], gu[:, :, 1::2][:, :, c0:c1]  # [E, hidden, I_rank] each
        put(dst + "gate_up", torch.cat([gate, up], dim=2).transpose(1, 2))
        gub = tensors.get(src + "experts.gate_up_proj_bias")  # [E, 2I]
        put(dst + "gate_up_bias", torch.cat([gub[:, 0::2][:, c0:c1], gub[:, 1::2][:, c0:c1]], dim=1))
        put(dst + "down", tensors.get(src + "experts.down_proj")[:, c0:c1].transpose(1, 2))  # [E, hidden, I_rank]
        if block.down_bias is not None:  # rank 0 (SparseMoE)
            put(dst + "down_bias", tensors.get(src + "experts.down_proj_bias"))

    def use_gguf_blocks(self, blocks: dict) -> int:
        raise ValueError(f"--quantization gguf is not supported for {ARCH} (mixture of experts)")


def parse_gpt_oss(cfg: dict) -> ModelConfig:
    """config.json -> ModelConfig as transformers' GptOssConfig reads it (its defaults for absent fields)."""
    if "num_experts" in cfg and "num_local_experts" not in cfg:  # GptOssConfig.attribute_map
        cfg = {**cfg, "num_local_experts": cfg["num_experts"]}
    cfg = {**_DEFAULTS, **cfg}
    if not (cfg.get("rope_parameters") or cfg.get("rope_scaling")):
        cfg["rope_parameters"] = {**_DEFAULT_ROPE, "rope_theta": cfg["rope_theta"]}
    if cfg.get("head_dim") is None:
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    # GptOssExperts applies its own activation whatever hidden_act says (transformers never reads it)
    cfg = {**cfg, "hidden_act": "silu"}
    n = cfg["num_hidden_layers"]
    window = cfg.get("sliding_window")
    windows = layer_windows(cfg, ARCH, window,
                            ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)])
    bias = bool(cfg.get("attention_bias"))
    out = base_config(cfg, ARCH, attention_bias=bias, qk_norm=False, sliding_window=None, windows=windows)
    limit, alpha = cfg.get("swiglu_limit"), cfg.get("swiglu_alpha")
    if limit is None or alpha is None:
        raise ValueError(f"swiglu_limit / swiglu_alpha must be numbers ({ARCH}: the experts' clamped SwiGLU)")
    moe = parse_moe(cfg, ARCH, experts_key="num_local_experts", default_experts=128, default_top_k=4,
                    inter_key="intermediate_size", default_inter=2880, norm_topk_prob=False)
    if moe.num_experts < 1:
        raise ValueError(f"num_local_experts {moe.num_experts} must be >= 1 ({ARCH})")
    moe = dataclasses.replace(moe, router_bias=True, softmax_after_topk=True, expert_bias=True,
                              swiglu_limit=float(limit), swiglu_alpha=float(alpha))
    return dataclasses.replace(out, moe=moe, attention_sinks=True)
