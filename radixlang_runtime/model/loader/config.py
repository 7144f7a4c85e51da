"""ModelConfig: the fields of a HF config.json that the native decoder needs, and the refusal of fields it
does not honour.

Which architectures exist and how each one's config.json is read is the registry's (model/models/); this
file holds what every family shares. A field that changes the math and is not implemented is refused by
name (ValueError) instead of being ignored: serving wrong text silently is worse than not serving.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Optional

from radixlang_runtime.classifier import classifier_architecture
from radixlang_runtime.model.layers.mla_spec import MLASpec
from radixlang_runtime.model.layers.moe_spec import MoESpec
from radixlang_runtime.model.layers.recurrent_spec import RecurrentSpec
from radixlang_runtime.model.prequant import parse_quant_config
from radixlang_runtime.model.layers.rope_spec import RopeSpec, parse_rope


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeSpec
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # Qwen2: q/k/v projections carry a bias
    qk_norm: bool  # Qwen3: RMSNorm over q and k per head before RoPE
    bos_token_id: Optional[int]
    eos_token_ids: tuple[int, ...]
    torch_dtype: str  # the dtype the weights are stored in
    sliding_window: Optional[int] = None  # the window some layer applies (None: none does); per layer: layer_windows
    max_context: Optional[int] = None  # the family's math is implemented only up to this context (None: any)
    max_context_reason: str = ""  # why, named in the refusal
    qk_norm_whole: bool = False  # OLMoE: RMSNorm over the whole q and k projections ([H D], [Hkv D]) before RoPE
    clip_qkv: Optional[float] = None  # OLMoE: q, k, v clamped to [-clip_qkv, clip_qkv] after the norm
    moe: Optional[MoESpec] = None  # mixture-of-experts feed-forward (model/layers/moe.py); None: dense MLPs only
    model_impl: str = "native"  # "transformers": transformers' modeling code runs it (models/transformers_fallback.py)
    # per layer: sliding window w > 0 (the query at position p sees keys at (p - w, p], transformers'
    # sliding_window) or 0 (full causal); () when no layer slides. Every attention path honours it.
    layer_windows: tuple[int, ...] = ()
    attn_logit_softcapping: Optional[float] = None  # Gemma 2: scores c * tanh(scores / c) (torch attention path)
    final_logit_softcapping: Optional[float] = None  # Gemma 2: logits c * tanh(logits / c)
    attn_scale: Optional[float] = None  # scores scale (Gemma: query_pre_attn_scalar ** -0.5); None: head_dim ** -0.5
    rope_local: Optional[RopeSpec] = None  # Gemma 3: the sliding layers' rope (rope_local_base_freq); None: rope
    trust_remote_code: bool = False  # the transformers fallback loads the checkpoint's own modeling code (auto_map)
    # per layer: chunked local attention c > 0 (Llama 4: the query at position p sees keys at [p - p % c, p]) or
    # 0 (as layer_windows says); () when no layer is chunked. Every attention path the model runs on honours it.
    layer_chunks: tuple[int, ...] = ()
    # per layer: False on a NoPE layer (no rotary on q and k: Llama 4, SmolLM3; every attention path and the fused
    # decode layer honour it), True where RoPE applies; () when every layer rotates
    layer_rope: tuple[bool, ...] = ()
    family_options: Optional[Any] = None  # a family's own parsed per-layer choices (models/llama4.Llama4Layers)
    attention_sinks: bool = False  # gpt-oss: a learned logit per query head in every softmax (AttentionBackend)
    mla: Optional[MLASpec] = None  # DeepSeek V2 / V3: multi-head latent attention (the pool's latent layout)
    # hybrid models: which layers keep a recurrent state, their sizes (LinearAttnSpec: Qwen3-Next, Qwen3.5's Gated
    # DeltaNet; Mamba2Spec: Granite 4.0-H's Mamba2); None: attention only
    linear_attn: Optional[RecurrentSpec] = None
    quant: Optional[Any] = None  # quantization_config's spec (model/prequant/); None: float weights
    vision: Optional[Any] = None  # image input (multimodal/vision_spec.VisionSpec: LLaVA); None: text only
    # multimodal rope (Qwen-VL): the rotary half's lanes per axis (t, row, column); (): one position per token
    mrope_section: tuple[int, ...] = ()
    num_labels: int = 0  # a sequence classifier's score head rows (models/sequence_classifier.py); 0: an LM head
    # Gemma 4: the last kv_shared_layers layers read an earlier layer's K/V and have no pool plane of their own
    kv_shared_layers: int = 0
    # layers with neither K/V nor a recurrent state (Nemotron-H's MLP and MoE blocks: a block is one mixer)
    kv_free_layers: int = 0

    def kv_entry(self, kv_heads: int) -> tuple[int, int, Optional[int]]:
        """(heads, head_dim, v_view) of a token's KV-pool entry (mem/kv_pool.KVPool): kv_heads K and V heads of
        head_dim; MLA: one latent entry whose first kv_lora_rank lanes are V (model/layers/mla_spec.py)."""
        if self.mla is not None:
            return 1, self.mla.entry_dim, self.mla.kv_lora_rank
        return kv_heads, self.head_dim, None

    def kv_shapes(self, kv_start: int, kv_count: int) -> Optional[tuple[tuple[int, int], ...]]:
        """(kv_heads, head_dim) of each pool layer for the rank holding KV heads [kv_start, kv_start + kv_count)
        of num_key_value_heads, where layers differ (a family's family_options.kv_shapes: Gemma 4); None: every
        layer's entry is kv_entry(kv_count)'s."""
        own = getattr(self.family_options, "kv_shapes", None)
        return None if own is None else own(self.num_key_value_heads, kv_start, kv_count)

    def kv_head_map(self, kv_start: int, kv_count: int) -> Optional[tuple[tuple[int, ...], ...]]:
        """Per pool layer, the layer's KV head each of the rank's pool heads holds, where layers differ (a family's
        family_options.kv_head_map: Gemma 4); None: heads [kv_start, kv_start + kv_count) in every layer."""
        own = getattr(self.family_options, "kv_head_map", None)
        return None if own is None else own(self.num_key_value_heads, kv_start, kv_count)

    def kv_pool_entry(self, kv_start: int, kv_count: int) -> dict:
        """mem/kv_pool.KVPool's (and its bytes_per_token's) entry arguments on the rank holding KV heads
        [kv_start, kv_start + kv_count): layers, KV heads, head_dim, latent V width, per-layer shapes."""
        heads, dim, v_view = self.kv_entry(kv_count)
        return dict(num_layers=self.kv_layer_count, kv_heads=heads, head_dim=dim, v_view=v_view,
                    shapes=self.kv_shapes(kv_start, kv_count))

    @property
    def kv_layer_count(self) -> int:
        """Layers with K/V in the pool (a hybrid model's linear-attention layers keep a state instead; KV-shared
        layers read their source layer's)."""
        return (self.num_hidden_layers - (self.linear_attn.num_linear if self.linear_attn else 0)
                - self.kv_shared_layers - self.kv_free_layers)

    def check_context_len(self, context_len: int) -> None:
        """A family whose math holds only up to some context (max_context) refuses a longer one by name."""
        if self.max_context is not None and self.max_context < context_len:
            raise ValueError(f"{self.max_context_reason}: context length {context_len} is refused; serve with "
                             f"--context-length {self.max_context} or less")

    @staticmethod
    def from_dict(cfg: dict, model_impl: str = "native", path: Optional[str] = None,
                  trust_remote_code: bool = False) -> "ModelConfig":
        """model_impl (--model-impl): native | transformers | auto (native where the registry has the family).
        path / trust_remote_code: the checkpoint directory and --trust-remote-code (the fallback's auto_map)."""
        from radixlang_runtime.model.models import TRANSFORMERS, family_for  # the registry imports this module

        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        family = family_for(archs[0], model_impl)
        if family is TRANSFORMERS and classifier_architecture(cfg) is not None:  # refuses one not served too
            raise ValueError(f"{archs[0]} runs on the native decoder only: --model-impl {model_impl} is not "
                             "implemented for sequence classifiers")
        if family is TRANSFORMERS:
            return family.parse(cfg, path, trust_remote_code)
        return family.parse(cfg)

    @staticmethod
    def from_dir(path: str, model_impl: str = "native", trust_remote_code: bool = False) -> "ModelConfig":
        with open(os.path.join(path, "config.json")) as f:
            return ModelConfig.from_dict(json.load(f), model_impl, path, trust_remote_code)


def refuse_common(cfg: dict, arch: str, softcap: bool = False) -> None:
    """Fields that change the math of any family here and that the family does not implement (softcap: the
    family honours attn_logit_softcapping / final_logit_softcapping, and its activation is its own)."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu" and not softcap:
        raise ValueError(f"hidden_act {act!r} is not supported ({arch}: the MLP is SiLU-gated)")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key) is not None and not softcap:
            raise ValueError(f"{key} {cfg[key]!r} is not supported (attention / logit soft-capping)")


def layer_windows(cfg: dict, arch: str, sliding_window: Optional[int],
                  default_layer_types: list[str]) -> tuple[int, ...]:
    """Each layer's window (0: full attention; () when none slides). layer_types from config.json when
    present, else the family's default; only full_attention and sliding_attention are known."""
    types = cfg.get("layer_types") or default_layer_types
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise ValueError(f"layer_types entry {unknown[0]!r} is not supported ({arch})")
    if len(types) not in (0, cfg["num_hidden_layers"]):
        raise ValueError(f"layer_types has {len(types)} entries for {cfg['num_hidden_layers']} layers ({arch})")
    if sliding_window is None or "sliding_attention" not in types:
        return ()
    if int(sliding_window) <= 0:
        raise ValueError(f"sliding_window {sliding_window!r} must be a positive number of positions ({arch})")
    return tuple(int(sliding_window) if t == "sliding_attention" else 0 for t in types)


def no_rope_layers(cfg: dict, arch: str, default_interval: int = 4) -> tuple[bool, ...]:
    """Each layer's RoPE flag from no_rope_layers (1: the layer rotates, 0: a NoPE layer; transformers reads its
    first num_hidden_layers entries), else every no_rope_layer_interval-th layer a NoPE one (Llama 4, SmolLM3)."""
    layers = cfg["num_hidden_layers"]
    flags = cfg.get("no_rope_layers")
    if not flags:
        interval = cfg.get("no_rope_layer_interval", default_interval)
        if not isinstance(interval, int) or interval <= 0:
            raise ValueError(f"no_rope_layer_interval {interval!r} must be a positive number of layers ({arch})")
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if len(flags) < layers:
        raise ValueError(f"no_rope_layers has {len(flags)} entries for {layers} layers ({arch})")
    return tuple(bool(f) for f in flags[:layers])


def base_config(cfg: dict, arch: str, *, attention_bias: bool, qk_norm: bool,
                sliding_window: Optional[int], partial_rotary: bool = False,
                windows: Optional[tuple[int, ...]] = None, softcap: bool = False) -> ModelConfig:
    """The fields every family reads the same way; the family decides bias, qk norm, the window and whether
    its transformers code honours partial_rotary_factor. sliding_window applies to every layer unless
    `windows` (layer_windows) says which."""
    refuse_common(cfg, arch, softcap)
    if windows is None:  # every layer (these families' transformers code reads no layer_types)
        if sliding_window is not None and int(sliding_window) <= 0:
            raise ValueError(f"sliding_window {sliding_window!r} must be a positive number of positions ({arch})")
        windows = () if sliding_window is None else (int(sliding_window),) * cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = parse_rope(cfg, head_dim)
    if rope.partial and not partial_rotary:  # the family's transformers code rotates every lane of a head
        raise ValueError(f"partial_rotary_factor (rotary_dim {rope.rotary_dim} < head_dim {head_dim}) is not "
                         f"supported for {arch}")
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    return ModelConfig(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope=rope,
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=attention_bias,
        qk_norm=qk_norm,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
        torch_dtype=str(cfg.get("torch_dtype", cfg.get("dtype", "float32"))),
        sliding_window=max(windows) if windows else None,
        layer_windows=windows,
        quant=parse_quant_config(cfg.get("quantization_config")),
    )
