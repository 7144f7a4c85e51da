"""Gemma 3 text (Gemma3ForCausalLM, model_type gemma3_text): Gemma 2's layers (models/gemma2.py) plus

- qk-norm: a per-head RMSNorm (times 1 + w) over q and k before RoPE (ModelConfig.qk_norm);
- the local / global layer pattern from layer_types (default: every sliding_window_pattern-th layer, 6,
  is global, the others slide);
- a rope per layer type: rope_parameters {"sliding_attention": ..., "full_attention": ...} (or the older
  rope_theta + rope_local_base_freq + rope_scaling keys); the global layers use ModelConfig.rope, the
  sliding ones ModelConfig.rope_local (their own Rotary tables, fb.rope_cos_sin_local);
- soft-capping only where the config sets it (transformers' defaults: none).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from radixlang_runtime.model.layers.attention.base import AttentionBackend
from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.models.llama import Reduce
from radixlang_runtime.model.models.gemma2 import Gemma2ForCausalLM, gemma_common
from radixlang_runtime.model.executor.parallel import Shard
from radixlang_runtime.model.layers.rope_spec import parse_rope
from radixlang_runtime.model.layers.rotary import Rotary

__all__ = ["Gemma3ForCausalLM", "parse_gemma3"]


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, rotary: Rotary, shard: Optional[Shard] = None,
                 reduce: Reduce = None):
        super().__init__(cfg, backend, rotary, shard, reduce)
        # the sliding layers' tables, beside the runner's (same positions, device and dtype)
        self.rotary_local = Rotary(cfg.rope_local, rotary.cos.shape[0], rotary.cos.device, rotary.cos.dtype)

    def local_rope(self, layer_id: int) -> bool:
        return bool(self.cfg.layer_windows) and self.cfg.layer_windows[layer_id] > 0

    def final_hidden(self, fb: ForwardBatch, rows=None):
        fb.rope_cos_sin_local = self.rotary_local.cos_sin(fb.positions)
        return super().final_hidden(fb, rows)


_GEMMA3_DEFAULTS = {"head_dim": 256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
                    "tie_word_embeddings": True, "query_pre_attn_scalar": 256, "sliding_window": 4096}


def _rope_per_type(cfg: dict) -> tuple[dict, dict]:
    """(global, local) rope dicts, as Gemma3TextConfig.convert_rope_params_to_dict builds them."""
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        unknown = sorted(set(params) - {"full_attention", "sliding_attention"})
        if unknown:
            raise ValueError(f"rope_parameters entry {unknown[0]!r} is not supported (Gemma3ForCausalLM: "
                             "full_attention and sliding_attention)")
        glob = dict(params.get("full_attention") or {"rope_type": "default"})
        local = dict(params.get("sliding_attention") or {"rope_type": "default"})
    else:  # the older keys: rope_scaling applies to the global layers only
        glob = {"rope_type": "default", **(cfg.get("rope_scaling") or params)}
        local = {"rope_type": "default"}
    glob.setdefault("rope_theta", cfg.get("rope_theta", 1_000_000.0))
    local.setdefault("rope_theta", cfg.get("rope_local_base_freq", 10_000.0))
    return glob, local


def parse_gemma3(cfg: dict) -> ModelConfig:
    arch = "Gemma3ForCausalLM"
    pattern = int(cfg.get("sliding_window_pattern", 6))
    glob, local = _rope_per_type(cfg)
    plain = {k: v for k, v in cfg.items() if k not in ("rope_parameters", "rope_scaling", "rope_theta")}
    out = gemma_common({**plain, "rope_parameters": glob}, arch, _GEMMA3_DEFAULTS,
                       lambda i: "sliding_attention" if (i + 1) % pattern else "full_attention", qk_norm=True)
    head_dim = out.head_dim
    rope_local = parse_rope({**plain, "rope_parameters": local}, head_dim)
    return dataclasses.replace(out, rope_local=rope_local)
