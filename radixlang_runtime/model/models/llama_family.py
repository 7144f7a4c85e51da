"""Llama, Mistral, Qwen2 and Qwen3: one decoder (model/models/llama.py), four ways of reading config.json.

Each parser reads the fields transformers' implementation of that architecture reads, with its defaults,
and refuses the ones that change the math and are not implemented here (config.refuse_common plus the
family's own: Llama's mlp_bias). Sliding windows (Mistral: every layer; Qwen2 / Qwen3: use_sliding_window,
layers >= max_window_layers or layer_types) become ModelConfig.layer_windows, honoured by every attention path.
"""

from __future__ import annotations

from radixlang_runtime.model.loader.config import ModelConfig, base_config, layer_windows
from radixlang_runtime.model.models.llama import LlamaForCausalLM

__all__ = ["LlamaForCausalLM", "parse_llama", "parse_mistral", "parse_qwen2", "parse_qwen3"]


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
