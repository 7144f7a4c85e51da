"""OLMo 2 (Olmo2ForCausalLM) and OLMo 3 (Olmo3ForCausalLM) on the shared decoder.

What differs from Llama, each as transformers' Olmo2 / Olmo3 code computes it:
- post-norms only: residual + post_attention_layernorm(attention(residual)), then
  residual + post_feedforward_layernorm(mlp(residual)); no input or pre-MLP norm (PostNormDecoderLayer);
- q_norm / k_norm: RMSNorm over the whole q / k projection ([H D], [Hkv D]: statistics across heads) before
  the reshape into heads and RoPE (ModelConfig.qk_norm_whole, as OLMoE's);
- OLMo 3: layer_types sliding / full (default: every 4th layer full) with sliding_window (ModelConfig.layer_windows),
  and a rope per layer type (rope_parameters {"sliding_attention": ..., "full_attention": ...}, or the older
  rope_theta + rope_scaling keys, which reach the full layers only): the full layers use ModelConfig.rope,
  the sliding ones ModelConfig.rope_local (their own Rotary tables, fb.rope_cos_sin_local).

attention_bias true (a bias on q / k / v and o_proj) is refused by name. The fused CPU decode layer steps aside
(model/executor/fused_decode.py: q / k norms and other layer shapes run on the modules).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import nn

from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.executor.parallel import Shard
from radixlang_runtime.model.layers.attention.base import AttentionBackend
from radixlang_runtime.model.layers.rope_spec import parse_rope
from radixlang_runtime.model.layers.rotary import Rotary
from radixlang_runtime.model.loader.config import ModelConfig, base_config, layer_windows
from radixlang_runtime.model.models.llama import Attention, LlamaForCausalLM, Reduce, RMSNorm, attend_local_rope

__all__ = ["Olmo2ForCausalLM", "parse_olmo2", "parse_olmo3"]

SLIDING, FULL = "sliding_attention", "full_attention"


class PostNormDecoderLayer(nn.Module):
    """Norms on the blocks' outputs only. Same contract as llama.DecoderLayer: h is the previous block's output
    (None for the first layer), residual the stream (updated in place); returns the MLP block's output (already
    normed) for the next layer or the final norm to add."""

    def __init__(self, cfg: ModelConfig, layer_id: int, backend: AttentionBackend, shard: Shard, reduce: Reduce,
                 mlp: nn.Module, local_rope: bool):
        super().__init__()
        self.self_attn = Attention(cfg, layer_id, backend, shard, reduce)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.local_rope = local_rope  # OLMo 3's sliding layers rotate with fb.rope_cos_sin_local

    def forward(self, h: Optional[torch.Tensor], residual: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        if h is not None:
            residual.add_(h)
        a = attend_local_rope(self.self_attn, residual, fb) if self.local_rope else self.self_attn(residual, fb)
        residual.add_(self.post_attention_layernorm(a))
        return self.post_feedforward_layernorm(self.mlp(residual))


class Olmo2ForCausalLM(LlamaForCausalLM):
    layer_norms = ("post_attention_layernorm", "post_feedforward_layernorm")

    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, rotary: Rotary, shard: Optional[Shard] = None,
                 reduce: Reduce = None):
        super().__init__(cfg, backend, rotary, shard, reduce)
        self.rotary_local = None  # the sliding layers' tables, beside the runner's (same positions, device, dtype)
        if cfg.rope_local is not None:
            self.rotary_local = Rotary(cfg.rope_local, rotary.cos.shape[0], rotary.cos.device, rotary.cos.dtype)

    def make_layers(self, cfg: ModelConfig, backend: AttentionBackend, shard: Shard, reduce: Reduce) -> list[nn.Module]:
        local = cfg.family_options or ()  # OLMo 3: each layer's type
        return [PostNormDecoderLayer(cfg, i, backend, shard, reduce, self.make_mlp(cfg, i, shard, reduce),
                                     cfg.rope_local is not None and local[i] == SLIDING)
                for i in range(cfg.num_hidden_layers)]

    def final_hidden(self, fb: ForwardBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        if self.rotary_local is not None:
            fb.rope_cos_sin_local = self.rotary_local.cos_sin(fb.positions)
        return super().final_hidden(fb, rows)


# the config classes' defaults for the fields read here (rope_theta: Olmo2's PreTrainedConfig default,
# Olmo3Config.default_theta)
_OLMO2_DEFAULTS = {"max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                   "eos_token_id": 50279, "rope_theta": 10000.0}
_OLMO3_DEFAULTS = {**_OLMO2_DEFAULTS, "rope_theta": 500000.0, "sliding_window": 4096}


def _olmo_common(cfg: dict, arch: str, windows: tuple[int, ...]) -> ModelConfig:
    if cfg.get("attention_bias"):
        raise ValueError(f"attention_bias true is not supported ({arch}: q / k / v / o projections without bias)")
    out = base_config(cfg, arch, attention_bias=False, qk_norm=False, sliding_window=None, windows=windows)
    return dataclasses.replace(out, qk_norm_whole=True)


def parse_olmo2(cfg: dict) -> ModelConfig:
    # Olmo2Config reads no sliding_window or layer_types: every layer is full causal attention
    return _olmo_common({**_OLMO2_DEFAULTS, **cfg}, "Olmo2ForCausalLM", ())


def _rope_per_type(cfg: dict, arch: str) -> tuple[dict, dict]:
    """(full, sliding) rope dicts, as Olmo3Config.convert_rope_params_to_dict builds them: rope_scaling updates
    the full layers' rope; rope_theta reaches only the full layers (the sliding ones keep default_theta unless
    their own entry sets one)."""
    params = cfg.get("rope_parameters") or {}
    unknown = sorted(set(params) - {FULL, SLIDING})
    if unknown:  # a flat dict: transformers keeps it beside the per-type defaults and rotates with those
        raise ValueError(f"rope_parameters entry {unknown[0]!r} is not supported ({arch}: a rope per layer type, "
                         f"{FULL} and {SLIDING})")
    scaling = dict(cfg.get("rope_scaling") or {})
    if "type" in scaling:  # the older name of rope_type
        scaling.setdefault("rope_type", scaling.pop("type"))
    full = {"rope_type": "default", **(params.get(FULL) or {}), **scaling}
    sliding = dict(params.get(SLIDING) or {"rope_type": "default"})
    full.setdefault("rope_theta", cfg.get("rope_theta", _OLMO3_DEFAULTS["rope_theta"]))
    sliding.setdefault("rope_theta", _OLMO3_DEFAULTS["rope_theta"])
    return full, sliding


def parse_olmo3(cfg: dict) -> ModelConfig:
    arch = "Olmo3ForCausalLM"
    cfg = {**_OLMO3_DEFAULTS, **cfg}
    n = cfg["num_hidden_layers"]
    types = tuple(cfg.get("layer_types") or [SLIDING if (i + 1) % 4 else FULL for i in range(n)])
    windows = layer_windows({**cfg, "layer_types": list(types)}, arch, cfg.get("sliding_window"), [])
    full, sliding = _rope_per_type(cfg, arch)
    plain = {k: v for k, v in cfg.items() if k not in ("rope_parameters", "rope_scaling", "rope_theta")}
    out = _olmo_common({**plain, "rope_parameters": full}, arch, windows)
    rope_local = parse_rope({**plain, "rope_parameters": sliding}, out.head_dim)
    return dataclasses.replace(out, rope_local=rope_local if SLIDING in types else None, family_options=types)
