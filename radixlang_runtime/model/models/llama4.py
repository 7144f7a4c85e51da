"""Llama 4 text (Llama4ForCausalLM, model_type llama4_text): the Llama decoder with

- chunked local attention on the layers layer_types marks chunked_attention (default: the RoPE layers, when
  attention_chunk_size is set): the query at position p sees keys at [p - p % c, p] (ModelConfig.layer_chunks;
  the attention backends honour them: attention/torch_backend.py, attention/triton_backend.py);
- NoPE layers (no_rope_layers[i] == 0; default every no_rope_layer_interval-th layer): no rotary; with
  attn_temperature_tuning the query is scaled by log1p(floor((p + 1) / floor_scale)) * attn_scale + 1;
- use_qk_norm: on the RoPE layers, a weightless L2 (RMS) norm over each q and k head after the rotary;
- RoPE on interleaved lane pairs (transformers' complex rotation): the q / k projection rows are permuted per
  head at load (even lanes, then odd ones), which turns it into the half-split rotation Rotary applies; the
  attention scores are unchanged by the permutation (q and k share it);
- MoE blocks on moe_layers (default every interleave_moe_layer_step-th layer), dense MLPs of
  intermediate_size_mlp elsewhere: a sigmoid router over the top-k logits whose score scales each token's
  *input* to its expert (model/moe.grouped_experts runs the experts), plus an always-on shared expert.

Llama4ForConditionalGeneration (the multimodal checkpoints) is served as its text model: config.json's
text_config, the weights under language_model. (the vision tower and projector are not loaded; the runtime
takes text prompts only).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from radixlang_runtime.model.layers.attention.base import AttentionBackend
from radixlang_runtime.model.loader.config import ModelConfig, base_config, no_rope_layers
from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.models.llama import MLP, Attention, DecoderLayer, LlamaForCausalLM, Reduce
from radixlang_runtime.model.layers.moe import SparseMoE, grouped_experts
from radixlang_runtime.model.layers.moe_spec import parse_moe
from radixlang_runtime.model.executor.parallel import Shard
from radixlang_runtime.model.layers.rotary import Rotary
from radixlang_runtime.model.loader.weights import SafetensorsDir

__all__ = ["Llama4ForCausalLM", "parse_llama4", "parse_llama4_multimodal"]

ARCH = "Llama4ForCausalLM"
MULTIMODAL = "Llama4ForConditionalGeneration"
TEXT_PREFIX = "language_model."  # the multimodal checkpoint's text weights: language_model.model.*, .lm_head.*
# Llama4TextConfig's defaults for the fields read here
_DEFAULTS = {"vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
             "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
             "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0}


@dataclasses.dataclass(frozen=True)
class Llama4Layers:
    """The per-layer choices of a Llama 4 text config (ModelConfig.family_options)."""

    qk_norm: bool  # use_qk_norm: L2 norm of q and k heads on the RoPE layers
    temperature_tuning: bool  # attn_temperature_tuning on the NoPE layers
    floor_scale: float
    attn_scale: float


def parse_llama4_multimodal(cfg: dict) -> ModelConfig:
    """Llama4ForConditionalGeneration: its text_config, served as the text model (weights under language_model.)."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"{MULTIMODAL}: config.json has no text_config to serve")
    tie = {cfg.get("tie_word_embeddings", False), text.get("tie_word_embeddings", False)}
    if len(tie) > 1:
        raise ValueError(f"{MULTIMODAL}: tie_word_embeddings differs between config.json and its text_config")
    if cfg.get("quantization_config") is not None:
        text = {**text, "quantization_config": cfg["quantization_config"]}
    return _parse({**text, "tie_word_embeddings": tie.pop()}, MULTIMODAL)


def parse_llama4(cfg: dict) -> ModelConfig:
    if cfg.get("text_config") is not None:
        raise ValueError(f"{ARCH}: config.json has a text_config (a multimodal config): its architecture must be "
                         f"{MULTIMODAL}")
    return _parse(cfg, ARCH)


def _parse(cfg: dict, arch: str) -> ModelConfig:
    """A Llama 4 text config (Llama4TextConfig's fields and defaults) -> ModelConfig for `arch`."""
    cfg = {**_DEFAULTS, **cfg}
    layers = cfg["num_hidden_layers"]
    if cfg.get("attention_bias"):
        raise ValueError(f"attention_bias true is not supported ({arch}: projections without bias)")
    no_rope = no_rope_layers(cfg, arch)  # per layer: True applies RoPE
    chunk = cfg.get("attention_chunk_size", 8192)
    types = cfg.get("layer_types") or ["chunked_attention" if r and chunk is not None else "full_attention"
                                       for r in no_rope]
    unknown = sorted(set(types) - {"full_attention", "chunked_attention"})
    if unknown or len(types) != layers:
        raise ValueError(f"layer_types {types!r} is not supported ({arch}: {layers} entries of full_attention or "
                         "chunked_attention)")
    if "chunked_attention" in types and (chunk is None or int(chunk) <= 0):
        raise ValueError(f"attention_chunk_size {chunk!r} must be a positive number of positions ({arch})")
    chunks = tuple(int(chunk) if t == "chunked_attention" else 0 for t in types)
    out = base_config({**cfg, "intermediate_size": cfg["intermediate_size_mlp"]}, arch, attention_bias=False,
                      qk_norm=False, sliding_window=None, windows=())
    step = int(cfg.get("interleave_moe_layer_step", 1))
    moe_layers = cfg.get("moe_layers")
    if moe_layers is None:
        moe_layers = list(range(step - 1, layers, step)) if step >= 1 else []
    experts = int(cfg.get("num_local_experts", 16))
    moe = parse_moe(cfg, arch, experts_key="num_local_experts", default_experts=16, default_top_k=1,
                    inter_key="intermediate_size", default_inter=8192, norm_topk_prob=False,
                    shared_intermediate_size=int(cfg["intermediate_size"]),
                    sparse_layers=tuple(experts > 0 and i in set(moe_layers) for i in range(layers)),
                    block="feed_forward")
    l4 = Llama4Layers(qk_norm=bool(cfg.get("use_qk_norm", True)),
                      temperature_tuning=bool(cfg.get("attn_temperature_tuning", True)),
                      floor_scale=float(cfg.get("floor_scale", 8192)), attn_scale=float(cfg.get("attn_scale", 0.1)))
    return dataclasses.replace(out, moe=moe, layer_chunks=chunks if any(chunks) else (), layer_rope=no_rope,
                               family_options=l4)


class Llama4Attention(Attention):
    """Llama's attention with Llama 4's per-layer RoPE / NoPE, L2 qk norm and NoPE temperature tuning."""

    def __init__(self, cfg: ModelConfig, layer_id: int, backend: AttentionBackend, shard: Shard, reduce: Reduce):
        super().__init__(cfg, layer_id, backend, shard, reduce)
        l4: Llama4Layers = cfg.family_options  # self.rope: Attention's, from ModelConfig.layer_rope
        self.l2_norm = l4.qk_norm and self.rope
        self.tuning = l4.temperature_tuning and not self.rope
        self.floor_scale, self.attn_scale, self.eps = l4.floor_scale, l4.attn_scale, cfg.rms_norm_eps

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        T = x.shape[0]
        qkv = self.qkv_proj(x)  # [T, (H + 2 Hkv) D]
        qk = qkv[:, : self.q_size + self.kv_size].view(T, self.h + self.hkv, self.d)
        v = qkv[:, self.q_size + self.kv_size :].view(T, self.hkv, self.d)
        if self.rope:
            qk = Rotary.apply(qk, fb.rope_cos_sin)
            if self.l2_norm:  # transformers' Llama4TextL2Norm: float32 statistics, no weight
                qk = F.rms_norm(qk.float(), (self.d,), None, self.eps).to(qk.dtype)
        q, k = qk[:, : self.h], qk[:, self.h :]
        if self.tuning:
            scales = torch.log1p(torch.floor((fb.positions.float() + 1.0) / self.floor_scale)) * self.attn_scale + 1.0
            q = (q * scales.view(T, 1, 1)).to(q.dtype)
        o = self.backend.forward(q.contiguous(), k.contiguous(), v, self.layer_id, fb)  # [T, H D]
        out = self.o_proj(o)
        return out if self.reduce is None else self.reduce(out)


class Llama4MoE(SparseMoE):
    """Llama 4's feed-forward block: top-k router logits through a sigmoid scale each token's input to its
    expert (not the expert's output), and the shared expert (no gate) is added."""

    def __init__(self, cfg: ModelConfig, shard: Shard, reduce: Reduce):
        super().__init__(cfg, shard, reduce)
        self.shared_gate = None  # Llama 4's shared expert is always on

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T, k = x.shape[0], self.spec.top_k
        logits = F.linear(x, self.router)  # [T, E]
        top, experts = torch.topk(logits, k, dim=-1)  # [T, k]
        scores = torch.sigmoid(top.float()).to(x.dtype)
        rows = (x.unsqueeze(1) * scores.unsqueeze(2)).reshape(T * k, -1)  # each assignment's scaled input
        ones = torch.ones(T * k, 1, dtype=torch.float32, device=x.device)
        routed = grouped_experts(rows, ones, experts.reshape(T * k, 1), self.gate_up, self.down, False,
                                 self.expert_linears)
        out = self.shared(x)
        out.add_(routed.view(T, k, -1).sum(dim=1))
        return out if self.reduce is None else self.reduce(out)


class Llama4DecoderLayer(DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_id: int, backend: AttentionBackend, shard: Shard, reduce: Reduce,
                 mlp: nn.Module):
        super().__init__(cfg, layer_id, backend, shard, reduce, mlp)
        self.self_attn = Llama4Attention(cfg, layer_id, backend, shard, reduce)


class _InterleavedQK:
    """The checkpoint's tensors with each q / k projection's rows permuted per head from interleaved lane pairs
    to halves (lanes 0, 2, 4, ..., then 1, 3, 5, ...), and the feed-forward blocks under Llama's names."""

    def __init__(self, tensors: SafetensorsDir, head_dim: int, prefix: str = ""):
        self.tensors, self.d, self.prefix = tensors, head_dim, prefix
        self.perm = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])

    def __contains__(self, name: str) -> bool:
        return self.prefix + name in self.tensors

    def get(self, name: str, rows: Optional[tuple[int, int]] = None, cols: Optional[tuple[int, int]] = None):
        t = self.tensors.get(self.prefix + name, rows=rows, cols=cols)
        if name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            heads = t.shape[0] // self.d
            t = t.reshape(heads, self.d, -1)[:, self.perm].reshape(t.shape)
        return t


class Llama4ForCausalLM(LlamaForCausalLM):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, rotary: Rotary, shard: Optional[Shard] = None,
                 reduce: Reduce = None):
        if reduce is not None or (shard is not None and shard.size > 1):
            raise ValueError(f"tensor parallelism is not implemented for {cfg.architecture} (use tp_size 1)")
        if not rotary.full:
            raise ValueError(f"partial rotary is not supported for {cfg.architecture}")
        super().__init__(cfg, backend, rotary, shard, reduce)
        for i, layer in enumerate(self.layers):
            self.layers[i] = Llama4DecoderLayer(cfg, i, backend, self.shard, reduce, layer.mlp)

    @staticmethod
    def make_mlp(cfg: ModelConfig, layer_id: int, shard: Shard, reduce: Reduce) -> nn.Module:
        return Llama4MoE(cfg, shard, reduce) if cfg.moe.sparse_layers[layer_id] else MLP(cfg, shard, reduce)

    def load_hf_state_dict(self, tensors: SafetensorsDir) -> None:
        prefix = TEXT_PREFIX if self.cfg.architecture == MULTIMODAL else ""
        super().load_hf_state_dict(_InterleavedQK(tensors, self.cfg.head_dim, prefix))

    def load_mlp(self, i: int, tensors: SafetensorsDir, put: Callable[[str, torch.Tensor], None]) -> None:
        src, dst, block = f"model.layers.{i}.feed_forward.", f"layers.{i}.mlp.", self.layers[i].mlp
        if not isinstance(block, Llama4MoE):
            put(dst + "gate_up_proj.weight", torch.cat([tensors.get(src + "gate_proj.weight"),
                                                        tensors.get(src + "up_proj.weight")]))
            put(dst + "down_proj.weight", tensors.get(src + "down_proj.weight"))
            return
        put(dst + "router", tensors.get(src + "router.weight"))
        put(dst + "gate_up", tensors.get(src + "experts.gate_up_proj").transpose(1, 2))  # [E, hidden, 2I] -> [E, 2I, h]
        put(dst + "down", tensors.get(src + "experts.down_proj").transpose(1, 2))  # [E, I, hidden] -> [E, hidden, I]
        s = src + "shared_expert."
        put(dst + "shared.gate_up_proj.weight", torch.cat([tensors.get(s + "gate_proj.weight"),
                                                           tensors.get(s + "up_proj.weight")]))
        put(dst + "shared.down_proj.weight", tensors.get(s + "down_proj.weight"))

    def use_gguf_blocks(self, blocks: dict) -> int:
        raise ValueError(f"--quantization gguf is not supported for {self.cfg.architecture}")
