"""Gemma 2 (Gemma2ForCausalLM) on the shared decoder, and the layers Gemma 3 shares with it.

What differs from Llama, each as transformers' Gemma2 code computes it:
- RMSNorm times (1 + w), in float32: the checkpoint's norm weights are read as 1 + w (GemmaTensors), so
  the shared RMSNorm (and its C kernel) computes it;
- pre + post norms: x -> input_layernorm -> attention -> post_attention_layernorm -> + residual ->
  pre_feedforward_layernorm -> MLP -> post_feedforward_layernorm -> + residual (GemmaDecoderLayer);
- GeGLU: down(gelu_tanh(gate) * up) (hidden_activation gelu_pytorch_tanh; any other is refused);
- embeddings times sqrt(hidden_size), rounded to the weights' dtype first;
- scores scaled by query_pre_attn_scalar ** -0.5 (ModelConfig.attn_scale);
- attention logit soft-capping (attn_logit_softcapping: every attention path the runner picks for it;
  on CPU the torch path, see TorchAttentionBackend) and final logit soft-capping on the logits;
- alternating sliding-window / global layers (layer_types; default: even layers slide).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from radixlang_runtime.model.layers.attention.base import AttentionBackend
from radixlang_runtime.model.loader.config import ModelConfig, base_config, layer_windows
from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.models.llama import MLP, DecoderLayer, LlamaForCausalLM, Reduce, RMSNorm, \
    attend_local_rope
from radixlang_runtime.model.executor.parallel import Shard
from radixlang_runtime.model.loader.weights import SafetensorsDir

__all__ = ["Gemma2ForCausalLM", "parse_gemma2"]

GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")  # transformers' names of gelu(approximate="tanh")


class GemmaTensors:
    """A checkpoint whose RMSNorm weights w are read as 1 + w (computed in float32, as Gemma's norm does)."""

    def __init__(self, tensors: SafetensorsDir):
        self.tensors = tensors

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def get(self, name: str, rows=None, cols=None) -> torch.Tensor:
        t = self.tensors.get(name, rows=rows, cols=cols)
        return 1.0 + t.float() if name.endswith("norm.weight") else t


class GeluMLP(MLP):
    """down(gelu_tanh(gate) * up): MLP's fused gate_up and row blocks, Gemma's activation."""

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.inter, dim=-1)  # [t, I] each
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class GemmaDecoderLayer(DecoderLayer):
    """Pre + post norms around attention and around the MLP. Same contract as DecoderLayer: returns the
    block's output for the next norm to add into the residual stream."""

    def __init__(self, cfg: ModelConfig, layer_id: int, backend: AttentionBackend, shard: Shard, reduce: Reduce,
                 mlp: nn.Module, local_rope: bool = False):
        super().__init__(cfg, layer_id, backend, shard, reduce, mlp)
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.local_rope = local_rope  # Gemma 3: this layer rotates with fb.rope_cos_sin_local

    def forward(self, h: torch.Tensor, residual: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        x = self.input_layernorm(residual) if h is None else self.input_layernorm.add_forward(h, residual)
        a = attend_local_rope(self.self_attn, x, fb) if self.local_rope else self.self_attn(x, fb)
        a = self.post_attention_layernorm(a)
        return self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm.add_forward(a, residual)))


class Gemma2ForCausalLM(LlamaForCausalLM):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, rotary, shard: Optional[Shard] = None,
                 reduce: Reduce = None):
        super().__init__(cfg, backend, rotary, shard, reduce)
        sh = self.shard
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(cfg, i, backend, sh, reduce, self.make_mlp(cfg, i, sh, reduce), self.local_rope(i))
            for i in range(cfg.num_hidden_layers))

    def local_rope(self, layer_id: int) -> bool:
        return False  # Gemma 2: one rope for every layer

    @staticmethod
    def make_mlp(cfg: ModelConfig, layer_id: int, shard: Shard, reduce: Reduce) -> nn.Module:
        return GeluMLP(cfg, shard, reduce)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = super().embed(ids)  # [T, hidden]; transformers rounds sqrt(hidden) to the weights' dtype first
        return x * torch.tensor(math.sqrt(self.cfg.hidden_size), dtype=x.dtype)

    def head_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The LM head's logits, soft-capped (the forward stays Llama's: pooling reads final_hidden)."""
        logits = super().head_logits(x)  # float32 [R, V]
        cap = self.cfg.final_logit_softcapping
        return logits if not cap else torch.tanh(logits / cap) * cap

    def load_hf_state_dict(self, tensors: SafetensorsDir) -> None:
        super().load_hf_state_dict(GemmaTensors(tensors))

    def load_layer_extras(self, i: int, tensors, put: Callable[[str, torch.Tensor], None]) -> None:
        for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
            put(f"layers.{i}.{name}.weight", tensors.get(f"model.layers.{i}.{name}.weight"))


def gemma_common(cfg: dict, arch: str, defaults: dict, default_types: Callable[[int], str], *,
                 qk_norm: bool) -> ModelConfig:
    """The config.json fields Gemma 2 and Gemma 3 read alike (`defaults`: the config class's defaults)."""
    cfg = {**defaults, **cfg}
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or GELU_TANH[0]
    if act not in GELU_TANH:
        raise ValueError(f"hidden_activation {act!r} is not supported ({arch}: the MLP is gelu_pytorch_tanh-gated)")
    if cfg.get("use_bidirectional_attention"):
        raise ValueError(f"use_bidirectional_attention true is not supported ({arch}: causal attention only)")
    n = cfg["num_hidden_layers"]
    windows = layer_windows(cfg, arch, cfg.get("sliding_window"), [default_types(i) for i in range(n)])
    out = base_config(cfg, arch, attention_bias=bool(cfg.get("attention_bias", False)), qk_norm=qk_norm,
                      sliding_window=None, windows=windows, softcap=True)
    return dataclasses.replace(
        out, attn_scale=float(cfg["query_pre_attn_scalar"]) ** -0.5,
        attn_logit_softcapping=cfg.get("attn_logit_softcapping") or None,
        final_logit_softcapping=cfg.get("final_logit_softcapping") or None)


_GEMMA2_DEFAULTS = {"head_dim": 256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
                    "tie_word_embeddings": True, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                    "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "rope_theta": 10000.0}


def parse_gemma2(cfg: dict) -> ModelConfig:
    # transformers' Gemma2Config: without layer_types, the even layers slide
    return gemma_common(cfg, "Gemma2ForCausalLM", _GEMMA2_DEFAULTS,
                        lambda i: "sliding_attention" if (i + 1) % 2 else "full_attention", qk_norm=False)
