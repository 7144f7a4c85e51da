"""Granite 4.0-H (GraniteMoeHybridForCausalLM): a hybrid decoder whose layers are Mamba2 (model/layers/mamba2.py:
a recurrent state in the state pool, no KV) or softmax attention over the paged KV pool, as config.json's
layer_types (or layers_block_type) says: "mamba" / "linear_attention" and "attention" / "full_attention".

Attention: q/k/v/o projections (attention_bias on all four), scores scaled by attention_multiplier (not
head_dim ** -0.5), rope when position_embedding_type is "rope", none when it is "nope" or absent. Granite's
multipliers: the embeddings times embedding_multiplier, each mixer's and feed-forward's output times
residual_multiplier before its residual add, the logits divided by logits_scaling. Feed-forward: a shared
SiLU-gated MLP (shared_intermediate_size) plus, when num_local_experts > 0, the MoE of model/layers/moe.py
(experts of intermediate_size, top-k of the router's logits then a softmax over the k) summed with it. Norms
are plain RMSNorms (weights as stored).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from radixlang_runtime.model.executor.parallel import Reduce, Shard
from radixlang_runtime.model.layers.hybrid_layer import HybridDecoderLayer
from radixlang_runtime.model.layers.attention.base import AttentionBackend
from radixlang_runtime.model.layers.hybrid_attention import HybridAttention
from radixlang_runtime.model.layers.mamba2 import Mamba2Mixer
from radixlang_runtime.model.layers.mamba2_spec import parse_mamba2
from radixlang_runtime.model.layers.mlp import MLP
from radixlang_runtime.model.layers.moe import SparseMoE
from radixlang_runtime.model.layers.moe_spec import parse_moe
from radixlang_runtime.model.loader.config import ModelConfig, base_config
from radixlang_runtime.model.loader.weights import SafetensorsDir, param_setter
from radixlang_runtime.model.models.mamba2_hybrid import Mamba2Hybrid
from radixlang_runtime.model.models.moe_decoder import MoEForCausalLM

ARCH = "GraniteMoeHybridForCausalLM"
_DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6}
_MAMBA, _ATTENTION = ("mamba", "linear_attention"), ("attention", "full_attention")
POSITION_TYPES = (None, "nope", "rope")


@dataclass(frozen=True)
class GraniteOptions:
    """Granite's scalars (ModelConfig.family_options)."""

    embedding_multiplier: float
    residual_multiplier: float
    logits_scaling: float
    rope: bool  # position_embedding_type "rope"; else the attention layers take no positions


def parse_granite_hybrid(cfg: dict) -> ModelConfig:
    """config.json -> ModelConfig; ValueError names a field not honoured."""
    cfg = {**_DEFAULTS, **cfg}
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or cfg.get("layers_block_type") or ["mamba"] * n
    unknown = sorted(set(types) - set(_MAMBA + _ATTENTION))
    if unknown:
        raise ValueError(f"layer_types entry {unknown[0]!r} is not supported ({ARCH}: mamba, attention)")
    if len(types) != n:
        raise ValueError(f"layer_types has {len(types)} entries for {n} layers ({ARCH})")
    position = cfg.get("position_embedding_type")
    if position not in POSITION_TYPES:
        raise ValueError(f"position_embedding_type {position!r} is not supported ({ARCH}: nope or rope)")
    norm = cfg.get("normalization_function", "rmsnorm")
    if norm != "rmsnorm":
        raise ValueError(f"normalization_function {norm!r} is not supported ({ARCH}: rmsnorm)")
    shared = int(cfg.get("shared_intermediate_size", 1024))
    # the dense (shared) MLP's width is what the shard splits; the experts' is intermediate_size
    out = base_config({**cfg, "intermediate_size": shared}, ARCH, attention_bias=bool(cfg.get("attention_bias", False)),
                      qk_norm=False, sliding_window=None)
    experts = int(cfg.get("num_local_experts", 8))
    moe = None
    if experts > 0:
        moe = dataclasses.replace(
            parse_moe(cfg, ARCH, experts_key="num_local_experts", default_experts=8, default_top_k=2,
                      inter_key="intermediate_size", default_inter=11008, norm_topk_prob=True,
                      shared_intermediate_size=shared, block="block_sparse_moe"),
            softmax_after_topk=True, shared_gated=False, shared_name="shared_mlp")
    options = GraniteOptions(embedding_multiplier=float(cfg.get("embedding_multiplier", 1.0)),
                             residual_multiplier=float(cfg.get("residual_multiplier", 1.0)),
                             logits_scaling=float(cfg.get("logits_scaling", 1.0)), rope=position == "rope")
    return dataclasses.replace(out, moe=moe, family_options=options,
                               attn_scale=float(cfg.get("attention_multiplier", 1.0)),
                               linear_attn=parse_mamba2(cfg, ARCH, tuple(t in _MAMBA for t in types)))


class GraniteMoeHybridForCausalLM(Mamba2Hybrid, MoEForCausalLM):
    """LlamaForCausalLM's embedding, head and layer loop with Granite's multipliers. One rank: the Mamba2 layers
    refuse tensor parallelism by name (Mamba2Spec.split)."""

    def make_layers(self, cfg: ModelConfig, backend: AttentionBackend, shard: Shard, reduce: Reduce) -> list[nn.Module]:
        spec = cfg.linear_attn.split(shard.size)
        opts: GraniteOptions = cfg.family_options
        layers = []
        for i, mamba in enumerate(spec.linear_layers):
            mixer = (Mamba2Mixer(spec, cfg.hidden_size, cfg.rms_norm_eps, spec.index_of(i)) if mamba
                     else HybridAttention(cfg, i - spec.index_of(i), backend, shard, opts.rope))
            mlp = self.make_mlp(cfg, i, shard, reduce)
            layers.append(HybridDecoderLayer(mixer, mlp, cfg, scale=opts.residual_multiplier))
        return layers

    @staticmethod
    def make_mlp(cfg: ModelConfig, layer_id: int, shard: Shard, reduce: Reduce) -> nn.Module:
        return SparseMoE(cfg, shard, reduce) if cfg.moe is not None else MLP(cfg, shard, reduce)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return super().embed(ids) * self.cfg.family_options.embedding_multiplier

    def head_logits(self, x: torch.Tensor) -> torch.Tensor:
        return super().head_logits(x) / self.cfg.family_options.logits_scaling

    def load_hf_state_dict(self, tensors: SafetensorsDir) -> None:
        own, done, put = param_setter(self)
        take = tensors.get
        put("embed_tokens.weight", take("model.embed_tokens.weight"))
        put("norm.weight", take("model.norm.weight"))
        if self.lm_head is not None:
            put("lm_head.weight", take("lm_head.weight"))
        for i, layer in enumerate(self.layers):
            src, dst = f"model.layers.{i}.", f"layers.{i}."
            put(dst + "input_layernorm.weight", take(src + "input_layernorm.weight"))
            put(dst + "post_attention_layernorm.weight", take(src + "post_attention_layernorm.weight"))
            if isinstance(layer.mixer, Mamba2Mixer):
                self._load_mamba(src + "mamba.", dst + "mixer.", tensors, put)
            else:
                a = src + "self_attn."
                for suffix in ("weight", "bias") if self.cfg.attention_bias else ("weight",):
                    put(dst + f"mixer.qkv_proj.{suffix}", [take(a + f"{p}_proj.{suffix}") for p in "qkv"])
                    put(dst + f"mixer.o_proj.{suffix}", take(a + f"o_proj.{suffix}"))
            self.load_mlp(i, tensors, put)
        missing = sorted(set(own) - done)
        if missing:
            raise ValueError(f"parameters not loaded: {missing[:5]}")

    def _load_mamba(self, src: str, dst: str, tensors: SafetensorsDir, put: Callable) -> None:
        take, spec = tensors.get, self.cfg.linear_attn
        for p in ("in_proj", "out_proj"):
            for suffix in ("weight", "bias") if spec.proj_bias else ("weight",):
                put(dst + f"{p}.{suffix}", take(src + f"{p}.{suffix}"))
        put(dst + "conv_weight", take(src + "conv1d.weight").squeeze(1))  # [C, 1, K] -> [C, K]
        if spec.conv_bias:
            put(dst + "conv_bias", take(src + "conv1d.bias"))
        for p in ("dt_bias", "A_log", "D"):
            put(dst + p, take(src + p))
        put(dst + "norm.weight", take(src + "norm.weight"))

    def load_mlp(self, i: int, tensors: SafetensorsDir, put: Callable[[str, torch.Tensor], None]) -> None:
        """The shared MLP (input_linear: gate rows, then up rows) and the experts: the checkpoint's names
        (block_sparse_moe.input_linear / output_linear / router.layer) or transformers 5's (experts.gate_up_proj,
        experts.down_proj, router.weight)."""
        src, dst, take = f"model.layers.{i}.", f"layers.{i}.mlp.", tensors.get
        shared = dst + ("shared." if self.cfg.moe is not None else "")
        put(shared + "gate_up_proj.weight", take(src + "shared_mlp.input_linear.weight"))
        put(shared + "down_proj.weight", take(src + "shared_mlp.output_linear.weight"))
        if self.cfg.moe is None:
            return
        moe = src + "block_sparse_moe."
        legacy = moe + "input_linear.weight" in tensors
        put(dst + "router", take(moe + ("router.layer.weight" if legacy else "router.weight")))
        put(dst + "gate_up", take(moe + ("input_linear.weight" if legacy else "experts.gate_up_proj")))
        put(dst + "down", take(moe + ("output_linear.weight" if legacy else "experts.down_proj")))
