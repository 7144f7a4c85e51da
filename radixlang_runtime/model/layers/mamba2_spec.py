"""Mamba2Spec: what a hybrid config.json asks of its Mamba2 layers (model/layers/mamba2.py runs them), and the
size of one request's recurrent state in them. parse_mamba2 reads Granite 4.0-H's fields (GraniteMoeHybridConfig's
mamba_* keys, transformers' defaults), a family with other names builds the spec and checks it with make_mamba2;
both refuse by name what the layer does not honour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from radixlang_runtime.model.layers.recurrent_spec import RecurrentSpec


@dataclass(frozen=True)
class Mamba2Spec(RecurrentSpec):
    """linear_layers: per layer, Mamba2 (True) or attention (False)."""

    num_heads: int  # mamba_n_heads
    head_dim: int  # mamba_d_head: num_heads x head_dim is the inner width (mamba_expand x hidden_size)
    state_size: int  # mamba_d_state: N, the state's columns per head row
    n_groups: int  # mamba_n_groups: B and C are shared by num_heads / n_groups heads; the gated norm's groups
    conv_kernel: int  # mamba_d_conv: the causal depthwise convolution's width
    chunk_size: int  # mamba_chunk_size: the longest chunk of the chunked scan (prefill)
    conv_bias: bool  # mamba_conv_bias
    proj_bias: bool  # mamba_proj_bias: in_proj and out_proj carry a bias

    @property
    def inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: x (inner), then B and C (n_groups x state_size each)."""
        return self.inner + 2 * self.n_groups * self.state_size

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The SSM state [num_heads, head_dim, state_size] (float32) and the conv window [conv_dim, K - 1]."""
        return (self.num_heads, self.head_dim, self.state_size), (self.conv_dim, self.conv_kernel - 1)

    def split(self, size: int) -> "Mamba2Spec":
        if size != 1:
            raise ValueError(f"tp_size {size} is not supported for Mamba2 layers (their heads are not split "
                             "across ranks)")
        return self


def _number(value: Any) -> float:
    """A config number, transformers' {"__float__": "Infinity"} spelling of a non-finite float included."""
    if isinstance(value, dict) and set(value) == {"__float__"}:
        return float(value["__float__"])
    return float(value)


def parse_mamba2(cfg: dict, arch: str, linear_layers: tuple[bool, ...]) -> Mamba2Spec:
    """Granite 4.0-H's mamba_* fields with transformers' defaults; ValueError names what is not honoured."""
    hidden = int(cfg["hidden_size"])
    heads = int(cfg.get("mamba_n_heads", 128))
    inner = int(cfg.get("mamba_expand", 2) * hidden)
    d_head = cfg.get("mamba_d_head", "auto")
    d_head = inner // heads if d_head == "auto" else int(d_head)
    if d_head * heads != inner:
        raise ValueError(f"mamba_d_head {d_head} x mamba_n_heads {heads} must be mamba_expand x hidden_size "
                         f"{inner} ({arch})")
    return make_mamba2(arch, Mamba2Spec(
        linear_layers=linear_layers, num_heads=heads, head_dim=d_head, state_size=int(cfg.get("mamba_d_state", 256)),
        n_groups=int(cfg.get("mamba_n_groups", 1)), conv_kernel=int(cfg.get("mamba_d_conv", 4)),
        chunk_size=int(cfg.get("mamba_chunk_size", 256)), conv_bias=bool(cfg.get("mamba_conv_bias", True)),
        proj_bias=bool(cfg.get("mamba_proj_bias", False))), cfg.get("time_step_limit", (0.0, math.inf)),
        names=("mamba_n_groups", "mamba_n_heads", "mamba_d_conv", "mamba_chunk_size"))


def make_mamba2(arch: str, spec: Mamba2Spec, limit: Any, names: tuple[str, str, str, str]) -> Mamba2Spec:
    """spec checked (ValueError naming the config field: `names` are the family's keys of the groups, heads,
    conv width and chunk size), with time_step_limit `limit` (only the no-op (0, inf) is honoured)."""
    groups, heads, conv, chunk = names
    if spec.n_groups < 1 or spec.num_heads % spec.n_groups:
        raise ValueError(f"{groups} {spec.n_groups} must divide {heads} {spec.num_heads} ({arch})")
    # softplus(dt) > 0: a lower bound <= 0 and no upper bound clamp nothing. transformers clamps dt only in its
    # chunked prefill (not in its decode step), so another limit has no single meaning to match
    if limit is None or len(limit) != 2 or _number(limit[0]) > 0 or _number(limit[1]) != math.inf:
        raise ValueError(f"time_step_limit {limit!r} is not supported ({arch}: only (0.0, inf), no clamp)")
    if spec.conv_kernel < 2:
        raise ValueError(f"{conv} {spec.conv_kernel} must be >= 2 ({arch})")
    if spec.chunk_size < 1:
        raise ValueError(f"{chunk} {spec.chunk_size} must be >= 1 ({arch})")
    return spec
