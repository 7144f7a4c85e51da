"""Gemma 4 text's config.json (Gemma4ForCausalLM, model_type gemma4_text; Gemma4ForConditionalGeneration's
text_config) -> ModelConfig plus Gemma4Layers, each field as transformers' Gemma4TextConfig reads it.

Attention shapes per layer: per_layer_config {layer: {head_dim, num_key_value_heads}} (or the older
global_head_dim / num_global_key_value_heads: the full-attention layers' head_dim, default 512). The KV pool
stores each layer at its own entry (Gemma4Layers.kv_shapes -> mem/kv_pool.py's groups): its head_dim lanes and
its KV heads, neither padded nor repeated; a token costs the sum over KV-computing layers of 2 x kv_heads x
head_dim x the dtype's size. ModelConfig.head_dim / num_key_value_heads are the widest (the tensor-parallel split
runs in whole GQA groups of the widest KV heads; kv_share maps a rank's share to each layer's own heads).
KV sharing: the last num_kv_shared_layers layers compute no K/V; each reads the pool plane of the last earlier
layer of its own layer type (ModelConfig.kv_shared_layers: those layers have no plane).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from radixlang_runtime.model.loader.config import ModelConfig, base_config, layer_windows
from radixlang_runtime.model.layers.rope_spec import parse_rope
from radixlang_runtime.model.models.gemma2 import GELU_TANH

__all__ = ["Gemma4Layers", "parse_gemma4", "parse_gemma4_multimodal"]

ARCH = "Gemma4ForCausalLM"
MULTIMODAL = "Gemma4ForConditionalGeneration"
FULL, SLIDE = "full_attention", "sliding_attention"
_DEFAULTS = {"vocab_size": 262144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
             "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
             "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "sliding_window": 512, "bos_token_id": 2,
             "eos_token_id": 1, "vocab_size_per_layer_input": 262144, "hidden_size_per_layer_input": 256}
_ROPE_DEFAULTS = {SLIDE: {"rope_type": "default", "rope_theta": 10_000.0},
                  FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}


@dataclass(frozen=True)
class Gemma4Layers:
    """Per layer (tuples of num_hidden_layers): the attention's own shape and the K/V it reads."""

    head_dims: tuple[int, ...]
    kv_heads: tuple[int, ...]
    kv_plane: tuple[int, ...]  # the pool plane of the layer's K/V: its own index, or its source's (KV-shared)
    k_eq_v: tuple[bool, ...]  # attention_k_eq_v on a full layer: V is the key projection (before its norms)
    sliding: tuple[bool, ...]  # rotates with ModelConfig.rope_local (else ModelConfig.rope)
    intermediate: tuple[int, ...]  # the MLP's width (use_double_wide_mlp: twice on the KV-shared layers)
    ple_dim: int  # hidden_size_per_layer_input (0: no per-layer input embeddings)
    ple_vocab: int  # vocab_size_per_layer_input
    moe: Optional[tuple[int, int, int]] = None  # enable_moe_block: (num_experts, top_k_experts, moe_intermediate_size)

    def owns_kv(self, layer: int) -> bool:
        return self.kv_plane[layer] == layer

    def kv_shapes(self, wide_kv: int, kv_start: int, kv_count: int) -> tuple[tuple[int, int], ...]:
        """(kv_heads, head_dim) of each KV-computing layer (the pool's layers) on the rank holding heads
        [kv_start, kv_start + kv_count) of the widest wide_kv: the layer's own heads of that share (kv_share)."""
        return tuple((len(heads), self.head_dims[i])
                     for i, heads in zip(self.kv_layers, self.kv_head_map(wide_kv, kv_start, kv_count)))

    def kv_head_map(self, wide_kv: int, kv_start: int, kv_count: int) -> tuple[tuple[int, ...], ...]:
        """Per KV-computing layer: the layer's KV head each of the rank's pool heads holds (rank_kv_heads)."""
        out = []
        for i in self.kv_layers:
            first, fills = kv_share(wide_kv, self.kv_heads[i], kv_start, kv_count)
            if rank_kv_heads(wide_kv, self.kv_heads[i], kv_start, kv_count) == len(fills):
                out.append(tuple(range(first, first + len(fills))))
            else:
                out.append(tuple(first + j for j, n in enumerate(fills) for _ in range(n)))
        return tuple(out)

    @property
    def kv_layers(self) -> list[int]:
        return [i for i in range(len(self.kv_plane)) if self.owns_kv(i)]


def kv_share(wide_kv: int, layer_kv: int, kv_start: int, kv_count: int) -> tuple[int, tuple[int, ...]]:
    """A layer with layer_kv KV heads on a rank holding heads [kv_start, kv_start + kv_count) of wide_kv (the
    split's unit): wide head j maps to the layer's KV head j // (wide_kv / layer_kv). Returns (the first layer KV
    head the rank computes, how many of its wide heads each of its layer KV heads serves, in order)."""
    per = wide_kv // layer_kv
    heads = [(kv_start + j) // per for j in range(kv_count)]
    first = heads[0]
    return first, tuple(heads.count(h) for h in range(first, heads[-1] + 1))


def rank_kv_heads(wide_kv: int, layer_kv: int, kv_start: int, kv_count: int) -> int:
    """The KV heads a rank stores for the layer: its own heads of its share, each once, when they serve equal
    numbers of its query heads; else (a rank's share cutting two heads' groups unequally) kv_count, each head
    repeated for the wide heads it serves."""
    fills = kv_share(wide_kv, layer_kv, kv_start, kv_count)[1]
    return len(fills) if len(set(fills)) == 1 else kv_count


def _layer_types(cfg: dict) -> list[str]:
    n = cfg["num_hidden_layers"]
    types = list(cfg.get("layer_types") or [SLIDE if (i + 1) % 6 else FULL for i in range(n)])
    if types:
        types[-1] = FULL  # transformers forces the last layer to full attention
    return types


def _shapes(cfg: dict, types: list[str]) -> tuple[list[int], list[int]]:
    """Each layer's (head_dim, num_key_value_heads)."""
    n = cfg["num_hidden_layers"]
    heads, dims = [cfg["num_key_value_heads"]] * n, [cfg["head_dim"]] * n
    per_layer = cfg.get("per_layer_config")
    if per_layer is None:  # Gemma4TextConfig builds it from these
        glob_kv = cfg.get("num_global_key_value_heads") if cfg.get("attention_k_eq_v", False) else None
        per_layer = {i: {"head_dim": cfg.get("global_head_dim", 512),
                         **({"num_key_value_heads": glob_kv} if glob_kv is not None else {})}
                     for i, t in enumerate(types) if t == FULL}
    for key, over in per_layer.items():
        i = int(key)
        if not 0 <= i < n:
            raise ValueError(f"per_layer_config names layer {key!r} of {n} ({ARCH})")
        unknown = sorted(set(over) - {"head_dim", "num_key_value_heads"})
        if unknown:
            raise ValueError(f"per_layer_config field {unknown[0]!r} is not supported ({ARCH}: head_dim and "
                             "num_key_value_heads per layer)")
        dims[i] = int(over.get("head_dim", dims[i]))
        heads[i] = int(over.get("num_key_value_heads", heads[i]))
    return dims, heads


def _kv_planes(n: int, shared: int, types: list[str]) -> list[int]:
    """transformers' kv_sharing_modes: a KV-shared layer reads the last non-shared layer of its type."""
    if not 0 <= shared < n:
        raise ValueError(f"num_kv_shared_layers {shared} is not supported ({ARCH}: {n} layers, at least one must "
                         "compute its K/V)")
    first = n - shared
    planes = list(range(n))
    for i in range(first, n):
        sources = [j for j in range(first) if types[j] == types[i]]
        if not sources:
            raise ValueError(f"layer {i} ({types[i]}) shares K/V, but no earlier layer of that type computes it "
                             f"({ARCH})")
        planes[i] = sources[-1]
    return planes


def _refuse(cfg: dict) -> None:
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or GELU_TANH[0]
    if act not in GELU_TANH:
        raise ValueError(f"hidden_activation {act!r} is not supported ({ARCH}: the MLP is gelu_pytorch_tanh-gated)")
    if cfg.get("use_bidirectional_attention") == "all":
        raise ValueError(f"use_bidirectional_attention 'all' is not supported ({ARCH}: causal attention only)")
    if cfg.get("attention_bias"):
        raise ValueError(f"attention_bias true is not supported ({ARCH}: projections without bias)")


def _moe(cfg: dict, arch: str) -> Optional[tuple[int, int, int]]:
    if not cfg.get("enable_moe_block"):
        return None
    sizes = tuple(cfg.get(k) for k in ("num_experts", "top_k_experts", "moe_intermediate_size"))
    if not all(isinstance(v, int) and v > 0 for v in sizes) or sizes[1] > sizes[0]:
        raise ValueError(f"enable_moe_block needs num_experts, top_k_experts (<= num_experts) and "
                         f"moe_intermediate_size, got {sizes} ({arch})")
    return sizes


def parse_gemma4(cfg: dict, arch: str = ARCH) -> ModelConfig:
    cfg = {**_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}
    _refuse(cfg)
    n, types = cfg["num_hidden_layers"], _layer_types(cfg)
    dims, kv_heads = _shapes(cfg, types)
    heads, wide_d, wide_kv = cfg["num_attention_heads"], max(dims), max(kv_heads)
    if heads % wide_kv or any(wide_kv % h for h in kv_heads):
        raise ValueError(f"KV heads per layer {sorted(set(kv_heads))} do not divide {heads} attention heads evenly "
                         f"({arch})")
    ropes = {**_ROPE_DEFAULTS, **(cfg.get("rope_parameters") or {})}
    unknown = sorted(set(ropes) - {FULL, SLIDE})
    if unknown:
        raise ValueError(f"rope_parameters entry {unknown[0]!r} is not supported ({arch}: full_attention and "
                         "sliding_attention)")
    specs = {}
    for t in (FULL, SLIDE):
        dim = {dims[i] for i in range(n) if types[i] == t} or {cfg["head_dim"]}
        if len(dim) > 1:
            raise ValueError(f"the {t} layers have head_dims {sorted(dim)} ({arch}: one rope per layer type)")
        specs[t] = parse_rope({"max_position_embeddings": cfg["max_position_embeddings"],
                               "rope_parameters": ropes[t]}, dim.pop())
        if specs[t].partial:  # transformers' default rope rotates every lane whatever partial_rotary_factor says
            raise ValueError(f"partial_rotary_factor on the {t} layers' {specs[t].rope_type} rope is not "
                             f"supported ({arch})")
    shared = int(cfg.get("num_kv_shared_layers") or 0)
    planes = _kv_planes(n, shared, types)
    windows = layer_windows({**cfg, "layer_types": types}, arch, cfg.get("sliding_window"), types)
    plain = {k: v for k, v in cfg.items() if k not in ("rope_parameters", "rope_scaling", "rope_theta",
                                                       "final_logit_softcapping", "attn_logit_softcapping")}
    out = base_config({**plain, "head_dim": wide_d, "num_key_value_heads": wide_kv}, arch, attention_bias=False,
                      qk_norm=True, sliding_window=None, windows=windows, softcap=True)
    k_eq_v = bool(cfg.get("attention_k_eq_v", False))
    wide = bool(cfg.get("use_double_wide_mlp", False))
    inter = cfg["intermediate_size"]
    layers = Gemma4Layers(
        head_dims=tuple(dims), kv_heads=tuple(kv_heads), kv_plane=tuple(planes),
        k_eq_v=tuple(k_eq_v and t != SLIDE for t in types), sliding=tuple(t == SLIDE for t in types),
        intermediate=tuple(inter * (2 if wide and planes[i] != i else 1) for i in range(n)),
        ple_dim=int(cfg.get("hidden_size_per_layer_input") or 0), ple_vocab=int(cfg["vocab_size_per_layer_input"]),
        moe=_moe(cfg, arch))
    return dataclasses.replace(out, rope=specs[FULL], rope_local=specs[SLIDE], attn_scale=1.0,
                               final_logit_softcapping=cfg.get("final_logit_softcapping") or None,
                               family_options=layers, kv_shared_layers=shared)


def parse_gemma4_multimodal(cfg: dict) -> ModelConfig:
    """Gemma4ForConditionalGeneration: its text_config, served as the text model (weights under
    model.language_model.; the vision and audio towers are not loaded)."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"{MULTIMODAL}: config.json has no text_config to serve")
    top_tie = cfg.get("tie_word_embeddings", True)
    return parse_gemma4({**text, "tie_word_embeddings": text.get("tie_word_embeddings", top_tie) and top_tie},
                        MULTIMODAL)
