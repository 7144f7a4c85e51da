"""A peft LoRA adapter directory (adapter_config.json + adapter_model.safetensors) read into per-layer A / B.

Implemented: `r`, `lora_alpha`, `use_rslora` (scaling alpha / sqrt(r), else alpha / r), `target_modules` among
q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (a list, or "all-linear"). Refused by name:
`embed_tokens` / `lm_head` (or any other) targets, `modules_to_save`, `use_dora`, `bias` other than "none",
`fan_in_fan_out` (a Conv1D base: the families served have Linear projections), `rank_pattern` /
`alpha_pattern`, `layers_to_transform`, a regex `target_modules`, and a rank above --max-lora-rank.

Weights: A [r, in] and B [out, r] per (layer, projection), B pre-multiplied by the scaling, in the model's dtype.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field

import torch
from safetensors.torch import load_file

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$")


@dataclass
class LoraConfig:
    rank: int
    alpha: float
    targets: tuple[str, ...]
    use_rslora: bool = False

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


@dataclass
class LoraAdapter:
    name: str
    lora_id: int
    config: LoraConfig
    # (layer, projection name) -> (A [r, in], B * scaling [out, r])
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def parse_config(raw: dict, where: str, max_rank: int) -> LoraConfig:
    """adapter_config.json -> LoraConfig; anything not implemented raises ValueError naming it."""
    def refuse(what: str) -> None:
        raise ValueError(f"LoRA adapter {where}: {what} is not supported")

    if raw.get("peft_type", "LORA") != "LORA":
        refuse(f"peft_type {raw.get('peft_type')!r} (LORA only)")
    if raw.get("use_dora"):
        refuse("use_dora (DoRA)")
    if raw.get("modules_to_save"):
        refuse(f"modules_to_save {raw['modules_to_save']!r}")
    if raw.get("bias", "none") != "none":
        refuse(f"bias {raw['bias']!r} (only 'none')")
    if raw.get("fan_in_fan_out"):
        refuse("fan_in_fan_out (a Conv1D base; the families served have Linear projections)")
    for key in ("rank_pattern", "alpha_pattern"):
        if raw.get(key):
            refuse(f"{key} (one rank and alpha for every module)")
    if raw.get("layers_to_transform") is not None:
        refuse("layers_to_transform")
    targets = raw.get("target_modules")
    if targets == "all-linear":
        targets = list(TARGETS)
    if isinstance(targets, str):
        refuse(f"target_modules as a pattern ({targets!r}; give a list)")
    if not isinstance(targets, list) or not targets:
        raise ValueError(f"LoRA adapter {where}: target_modules must be a non-empty list")
    bad = [t for t in targets if t not in TARGETS]
    if bad:
        refuse(f"target module(s) {', '.join(map(repr, bad))} (implemented: {', '.join(TARGETS)})")
    rank = raw.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"LoRA adapter {where}: r must be an integer >= 1; got {rank!r}")
    if rank > max_rank:
        raise ValueError(f"LoRA adapter {where}: rank {rank} exceeds --max-lora-rank {max_rank}")
    alpha = raw.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ValueError(f"LoRA adapter {where}: lora_alpha must be a number; got {alpha!r}")
    return LoraConfig(rank, float(alpha), tuple(dict.fromkeys(targets)), bool(raw.get("use_rslora", False)))


def load_adapter(name: str, path: str, lora_id: int, num_layers: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device) -> LoraAdapter:
    """Read one adapter directory; every target module of every layer must have its A and B."""
    cfg_path = os.path.join(path, "adapter_config.json")
    if not os.path.isfile(cfg_path):
        raise ValueError(f"LoRA adapter {name!r}: no adapter_config.json in {path!r}")
    with open(cfg_path) as f:
        cfg = parse_config(json.load(f), repr(name), max_rank)
    st_path = os.path.join(path, "adapter_model.safetensors")
    if not os.path.isfile(st_path):
        raise ValueError(f"LoRA adapter {name!r}: no adapter_model.safetensors in {path!r}")
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in load_file(st_path).items():
        m = _KEY.search(key)
        if m is None:
            raise ValueError(f"LoRA adapter {name!r}: tensor {key!r} is not a LoRA A/B of a supported projection")
        layer, proj, ab = int(m.group(1)), m.group(2), m.group(3)
        if proj not in cfg.targets or layer >= num_layers:
            raise ValueError(f"LoRA adapter {name!r}: tensor {key!r} is outside its target_modules / the model")
        found.setdefault((layer, proj), {})[ab] = t
    adapter = LoraAdapter(name, lora_id, cfg)
    for layer in range(num_layers):
        for proj in cfg.targets:
            ab = found.get((layer, proj), {})
            if set(ab) != {"A", "B"}:
                raise ValueError(f"LoRA adapter {name!r}: layer {layer} {proj} lacks lora_A / lora_B")
            a, b = ab["A"], ab["B"]
            if a.shape[0] != cfg.rank or b.shape[1] != cfg.rank:
                raise ValueError(f"LoRA adapter {name!r}: layer {layer} {proj} has rank {a.shape[0]}, config r "
                                 f"{cfg.rank}")
            adapter.weights[(layer, proj)] = (a.to(device, dtype).contiguous(),
                                              (b.float() * cfg.scaling).to(device, dtype).contiguous())
    return adapter
