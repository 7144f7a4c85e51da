"""Llama, Mistral, Qwen2, Qwen3 and SmolLM3: one decoder (model/models/llama.py), five ways of reading config.json.

Each parser reads the fields transformers' implementation of that architecture reads, with its defaults,
and refuses the ones that change the math and are not implemented here (config.refuse_common plus the
family's own: Llama's mlp_bias). Sliding windows (Mistral: every layer; Qwen2 / Qwen3: use_sliding_window,
layers >= max_window_layers or layer_types) become ModelConfig.layer_windows, honoured by every attention path.
SmolLM3's NoPE layers (no_rope_layers, default every no_rope_layer_interval-th layer) become
ModelConfig.layer_rope: the decoder's attention skips the rotary on them in every path (rope_store.c and the
fused decode layer store their K / V unrotated).
"""

from __future__ import annotations

import dataclasses

from radixlang_runtime.model.loader.config import ModelConfig, base_config, layer_windows, no_rope_layers
from radixlang_runtime.model.models.llama import LlamaForCausalLM

__all__ = ["LlamaForCausalLM", "parse_llama", "parse_mistral", "parse_qwen2", "parse_qwen3", "parse_smollm3"]


def parse_llama(cfg: dict) -> ModelConfig:
    arch = "LlamaForCausalLM"
    if cfg.get("mlp_bias"):
        raise ValueError(f"mlp_bias true is not supported ({arch}: MLP projections without bias)")
    window = layer_windows(cfg, arch, cfg.get("sliding_window"), [])
    return base_config(cfg, arch, attention_bias=bool(cfg.get("attention_bias", False)), qk_norm=False,
                       sliding_window=None, windows=window)


def parse_mistral(cfg: dict) -> ModelConfig:
    # transformers' MistralConfig: sliding_window defaults to 4096 and applies to every layer (null: none);
    # MistralForCausalLM ignores layer_types
    window = cfg.get("sliding_window", 4096)
    return base_config(cfg, "MistralForCausalLM", attention_bias=False, qk_norm=False,
                       sliding_window=None if window is None else int(window))


def _qwen_window(cfg: dict, arch: str):
    """Qwen2 / Qwen3: the window applies only with use_sliding_window, to layers >= max_window_layers."""
    window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window", False) else None
    first = cfg.get("max_window_layers", 28)
    default = ["sliding_attention" if window is not None and i >= first else "full_attention"
               for i in range(cfg["num_hidden_layers"])]
    return layer_windows(cfg, arch, window, default)


def parse_qwen2(cfg: dict) -> ModelConfig:
    arch = "Qwen2ForCausalLM"  # q/k/v always carry a bias
    return base_config(cfg, arch, attention_bias=True, qk_norm=False, sliding_window=None,
                       windows=_qwen_window(cfg, arch))


def parse_qwen3(cfg: dict) -> ModelConfig:
    arch = "Qwen3ForCausalLM"
    return base_config(cfg, arch, attention_bias=bool(cfg.get("attention_bias", False)), qk_norm=True,
                       sliding_window=None, windows=_qwen_window(cfg, arch))


# SmolLM3Config's defaults for the fields read here (rope_theta: its default_theta)
_SMOLLM3_DEFAULTS = {"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                     "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 32768,
                     "rms_norm_eps": 1e-6, "rope_theta": 2000000.0, "bos_token_id": 128000, "eos_token_id": 128001,
                     "tie_word_embeddings": True}


def parse_smollm3(cfg: dict) -> ModelConfig:
    """SmolLM3: Llama with NoPE layers; with use_sliding_window, the layers layer_types marks sliding_attention
    (default: the NoPE layers) see the last sliding_window positions."""
    arch = "SmolLM3ForCausalLM"
    cfg = {**_SMOLLM3_DEFAULTS, **cfg}
    for key in ("attention_bias", "mlp_bias"):  # transformers' attention_bias also puts a bias on o_proj
        if cfg.get(key):
            raise ValueError(f"{key} true is not supported ({arch}: projections without bias)")
    rope = no_rope_layers(cfg, arch)
    use, window = bool(cfg.get("use_sliding_window", False)), cfg.get("sliding_window")
    default = ["sliding_attention" if use and window is not None and not r else "full_attention" for r in rope]
    types = cfg.get("layer_types") or default
    if "sliding_attention" in types and (not use or window is None):
        # transformers builds those layers' mask from sliding_window but passes the attention no window
        raise ValueError(f"layer_types sliding_attention with use_sliding_window {use} and sliding_window {window!r} "
                         f"is not supported ({arch})")
    windows = layer_windows({**cfg, "layer_types": types}, arch, window if use else None, default)
    out = base_config(cfg, arch, attention_bias=False, qk_norm=False, sliding_window=None, windows=windows)
    return dataclasses.replace(out, layer_rope=rope if not all(rope) else ())
