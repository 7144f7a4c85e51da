"""RopeSpec: the rotary-embedding fields of a HF config.json, parsed and checked once (no torch).

Both spellings are read: transformers 5's `rope_parameters` (rope_theta inside) and the older
`rope_scaling` + top-level `rope_theta` (with `type` for `rope_type`). A rope_type this runtime does not
implement, or a field the chosen rope_type does not read, is refused by name (ValueError), never ignored.
The formulas are model/layers/rotary.py's; the fields each type reads are transformers' (modeling_rope_utils).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

_COMMON = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
FIELDS = {  # rope_type -> the fields it reads besides _COMMON
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"},
    "longrope": {"short_factor", "long_factor", "factor", "attention_factor", "original_max_position_embeddings"},
    # Gemma 4's global layers: the first partial_rotary_factor of each neox half of the head rotates, the rest of
    # the head's frequencies are zero (rotary_dim stays head_dim; RopeSpec.proportion keeps the factor)
    "proportional": {"factor"},
}
_REQUIRED = {"linear": ("factor",), "dynamic": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
             "yarn": ("factor",), "longrope": ("short_factor", "long_factor")}
_ORIGINAL_MAX = ("llama3", "yarn", "longrope")  # types that read original_max_position_embeddings


@dataclass(frozen=True)
class RopeSpec:
    """One model's RoPE. rotary_dim <= head_dim (even): the leading rotary_dim lanes of a head rotate
    (neox halves of rotary_dim), the rest pass through."""

    head_dim: int
    rotary_dim: int
    theta: float
    max_position_embeddings: int  # config.json's: dynamic's original window, yarn / longrope's default factor
    rope_type: str = "default"
    factor: Optional[float] = None
    original_max_position_embeddings: Optional[int] = None
    low_freq_factor: Optional[float] = None  # llama3
    high_freq_factor: Optional[float] = None
    attention_factor: Optional[float] = None  # yarn / longrope: None = derived from factor
    beta_fast: Optional[float] = None  # yarn (None: 32)
    beta_slow: Optional[float] = None  # yarn (None: 1)
    mscale: Optional[float] = None
    mscale_all_dim: Optional[float] = None
    truncate: bool = True
    short_factor: Optional[tuple[float, ...]] = None  # longrope: [rotary_dim / 2] each
    long_factor: Optional[tuple[float, ...]] = None
    proportion: Optional[float] = None  # proportional: the rotated share of each half of the head

    @staticmethod
    def plain(head_dim: int, theta: float, max_position_embeddings: int = 4096) -> "RopeSpec":
        return RopeSpec(head_dim, head_dim, float(theta), max_position_embeddings)

    @property
    def partial(self) -> bool:
        return self.rotary_dim < self.head_dim

    def describe(self) -> str:
        extra = f", rotary_dim {self.rotary_dim}/{self.head_dim}" if self.partial else ""
        factor = f" x{self.factor:g}" if self.factor is not None else ""
        return f"{self.rope_type}{factor} (theta {self.theta:g}{extra})"


def _float(params: dict, key: str) -> Optional[float]:
    v = params.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"rope field {key!r} must be a number, got {v!r}")
    return float(v)


def _factors(params: dict, key: str, half: int) -> Optional[tuple[float, ...]]:
    v = params.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or len(v) != half or not all(isinstance(x, (int, float)) for x in v):
        raise ValueError(f"rope field {key!r} must be a list of {half} numbers (rotary_dim / 2)")
    return tuple(float(x) for x in v)


def parse_rope(cfg: dict, head_dim: int) -> RopeSpec:
    """config.json -> RopeSpec; ValueError naming an unknown rope_type or a field it does not read."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if "rope_type" not in params and "type" in params:
        params["rope_type"] = params["type"]
    rope_type = params.get("rope_type") or "default"
    if rope_type not in FIELDS:
        raise ValueError(f"rope_type {rope_type!r} is not supported (supported: {', '.join(FIELDS)})")
    unknown = sorted(set(params) - _COMMON - FIELDS[rope_type])
    if unknown:
        raise ValueError(f"rope field {unknown[0]!r} is not read by rope_type {rope_type!r} "
                         f"(it reads: {', '.join(sorted(FIELDS[rope_type])) or 'no extra fields'})")
    for key in _REQUIRED.get(rope_type, ()):
        if key not in params:
            raise ValueError(f"rope_type {rope_type!r} needs the rope field {key!r}")
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    prf = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    proportional = rope_type == "proportional"
    rotary_dim = head_dim if proportional else int(head_dim * float(prf))
    if rotary_dim <= 0 or rotary_dim > head_dim or rotary_dim % 2:
        raise ValueError(f"partial_rotary_factor {prf!r} gives rotary_dim {rotary_dim} (head_dim {head_dim}): "
                         "it must be even and in (0, head_dim]")
    max_pos = int(cfg.get("max_position_embeddings", 4096))
    original = None
    if rope_type in _ORIGINAL_MAX:  # as transformers: a top-level value (Phi-3) wins over the rope dict's
        original = int(cfg.get("original_max_position_embeddings")
                       or params.get("original_max_position_embeddings") or max_pos)
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ValueError(f"rope field 'truncate' must be true or false, got {truncate!r}")
    half = rotary_dim // 2
    spec = RopeSpec(
        head_dim=head_dim, rotary_dim=rotary_dim, theta=float(theta), max_position_embeddings=max_pos,
        rope_type=rope_type, factor=_float(params, "factor"), original_max_position_embeddings=original,
        low_freq_factor=_float(params, "low_freq_factor"), high_freq_factor=_float(params, "high_freq_factor"),
        attention_factor=_float(params, "attention_factor"), beta_fast=_float(params, "beta_fast"),
        beta_slow=_float(params, "beta_slow"), mscale=_float(params, "mscale"),
        mscale_all_dim=_float(params, "mscale_all_dim"), truncate=truncate,
        short_factor=_factors(params, "short_factor", half), long_factor=_factors(params, "long_factor", half),
        proportion=float(prf) if proportional else None)
    if rope_type in ("linear", "dynamic", "llama3") and (spec.factor is None or spec.factor <= 0):
        raise ValueError(f"rope field 'factor' must be a positive number for rope_type {rope_type!r}")
    if rope_type == "llama3" and spec.low_freq_factor == spec.high_freq_factor:
        raise ValueError("rope fields 'low_freq_factor' and 'high_freq_factor' must differ (llama3)")
    return spec
