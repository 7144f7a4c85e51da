"""Phi-3 (Phi3ForCausalLM): the Llama decoder with q/k/v and gate/up stored fused in the checkpoint,
partial rotary (partial_rotary_factor) and longrope (short / long factors; legacy "su" / "yarn" names).

The fused tensors are read through a view that answers the Llama names the decoder loads (row ranges of
qkv_proj / gate_up_proj), so tensor-parallel ranks still read only their slices.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

import torch

from radixlang_runtime.model.loader.config import ModelConfig, base_config
from radixlang_runtime.model.models.llama import LlamaForCausalLM
from radixlang_runtime.model.loader.weights import Range, SafetensorsDir

_SPLIT = re.compile(r"(model\.layers\.\d+\.)(self_attn\.(q|k|v)_proj|mlp\.(gate|up)_proj)\.weight")


class FusedPhi3Tensors:
    """A SafetensorsDir view: model.layers.i.self_attn.{q,k,v}_proj.weight and mlp.{gate,up}_proj.weight are
    rows of the fused qkv_proj ([H D + 2 Hkv D, hidden]: q, k, v) and gate_up_proj ([2 I, hidden]: gate, up)."""

    def __init__(self, tensors: SafetensorsDir, cfg: ModelConfig):
        self.tensors = tensors
        q, kv, inter = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim, \
            cfg.intermediate_size
        self.parts = {"q": ("self_attn.qkv_proj", 0, q), "k": ("self_attn.qkv_proj", q, kv),
                      "v": ("self_attn.qkv_proj", q + kv, kv), "gate": ("mlp.gate_up_proj", 0, inter),
                      "up": ("mlp.gate_up_proj", inter, inter)}

    def __contains__(self, name: str) -> bool:
        m = _SPLIT.fullmatch(name)
        return name in self.tensors if m is None else f"{m.group(1)}{self.parts[m.group(3) or m.group(4)][0]}.weight" \
            in self.tensors

    def get(self, name: str, rows: Range = None, cols: Range = None) -> torch.Tensor:
        m = _SPLIT.fullmatch(name)
        if m is None:
            return self.tensors.get(name, rows=rows, cols=cols)
        fused, start, size = self.parts[m.group(3) or m.group(4)]
        a, b = rows if rows is not None else (0, size)
        return self.tensors.get(f"{m.group(1)}{fused}.weight", rows=(start + a, start + b), cols=cols)


class Phi3ForCausalLM(LlamaForCausalLM):
    def load_hf_state_dict(self, tensors: SafetensorsDir) -> None:
        super().load_hf_state_dict(FusedPhi3Tensors(tensors, self.cfg))


def parse_phi3(cfg: dict) -> ModelConfig:
    # transformers' Phi3Config: original_max_position_embeddings defaults to 4096 at the top level (it wins
    # over the rope dict's), "su" and "yarn" are old names of longrope, the window (default none) applies to
    # every layer
    cfg = {**cfg, "original_max_position_embeddings": cfg.get("original_max_position_embeddings", 4096)}
    key = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
    rope = dict(cfg.get(key) or {})
    kind = rope.get("rope_type", rope.get("type"))
    if kind in ("su", "yarn"):
        rope.pop("type", None)
        cfg[key] = {**rope, "rope_type": "longrope"}
    window: Optional[int] = cfg.get("sliding_window")
    out = base_config(cfg, "Phi3ForCausalLM", attention_bias=False, qk_norm=False,
                      sliding_window=None if window is None else int(window), partial_rotary=True)
    if out.rope.rope_type == "longrope":
        # transformers' Phi-3 generate drops the cache when a sequence first passes the original window and
        # recomputes every position with long_factor; a paged, shared cache cannot (not implemented), so only
        # contexts inside the window (short_factor throughout) are served
        orig = out.rope.original_max_position_embeddings
        out = dataclasses.replace(out, max_context=orig, max_context_reason=(
            f"longrope on Phi3ForCausalLM switches every position to long_factor past "
            f"original_max_position_embeddings {orig} (transformers recomputes the cache then; not implemented)"))
    return out
