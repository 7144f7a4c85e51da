"""RoPE variants: inverse frequencies per rope_type (default, linear, dynamic NTK, llama3, yarn, longrope),
partial rotary, and Rotary: the cos/sin tables of every position and their application.

`inv_freq(spec, seq_len)` follows transformers' ROPE_INIT_FUNCTIONS (modeling_rope_utils) op for op in
float32, so the tables match HF's to the bit for every position HF computes the same way.

Sequence-length-dependent types are made per position, so a token's rotation depends only on its own
position (what a paged, prefix-shared KV cache needs):
- dynamic: position p rotates with the NTK base for seq_len = max(p + 1, max_position_embeddings);
- longrope: position p uses long_factor when p + 1 > original_max_position_embeddings, else short_factor.
That is exactly transformers' rule for tokens decoded one at a time (HF recomputes the frequencies from the
largest position of each forward call and keeps the cached keys as they were rotated). HF differs for a
prompt longer than the original window fed in one call: it rotates every prompt token with the prompt's
length; no cache that reuses prefixes across requests can reproduce that.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from radixlang_runtime.model.layers.rope_spec import RopeSpec


def _exponents(dim: int, device: Optional[torch.device]) -> torch.Tensor:
    return torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim  # [dim / 2]


def _yarn(spec: RopeSpec, device: Optional[torch.device]) -> tuple[torch.Tensor, float]:
    dim, base = spec.rotary_dim, spec.theta
    original = spec.original_max_position_embeddings
    factor = spec.factor if spec.factor is not None else spec.max_position_embeddings / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = spec.attention_factor
    if attention is None:
        attention = (float(mscale(factor, spec.mscale) / mscale(factor, spec.mscale_all_dim))
                     if spec.mscale and spec.mscale_all_dim else mscale(factor))

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(spec.beta_fast or 32), correction_dim(spec.beta_slow or 1)
    if spec.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1).to(device)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(device=device, dtype=torch.float) / dim)
    extrapolation = 1 - ramp  # 1: the dimension keeps its trained frequency
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, attention


def _llama3(spec: RopeSpec, device: Optional[torch.device]) -> torch.Tensor:
    inv = 1.0 / (spec.theta ** _exponents(spec.rotary_dim, device))
    factor, lo, hi = spec.factor, spec.low_freq_factor, spec.high_freq_factor
    old = spec.original_max_position_embeddings
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / lo, inv / factor, inv)  # long wavelengths: divided by factor
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / hi) * ~(wavelen > old / lo)
    return torch.where(medium, smoothed, scaled)


def _longrope_attention(spec: RopeSpec) -> float:
    original = spec.original_max_position_embeddings
    factor = spec.factor if spec.factor is not None else spec.max_position_embeddings / original
    if spec.attention_factor is not None:
        return spec.attention_factor
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def inv_freq(spec: RopeSpec, seq_len: Optional[int] = None,
             device: Optional[torch.device] = None) -> tuple[torch.Tensor, float]:
    """(inv_freq [rotary_dim / 2] float32, attention factor: cos and sin are multiplied by it).
    seq_len matters to dynamic and longrope only (None: the model's start-up frequencies)."""
    t, dim = spec.rope_type, spec.rotary_dim
    if t == "default":
        return 1.0 / (spec.theta ** _exponents(dim, device)), 1.0
    if t == "linear":
        return 1.0 / (spec.theta ** _exponents(dim, device)) / spec.factor, 1.0
    if t == "dynamic":
        mpe, factor = spec.max_position_embeddings, spec.factor
        # HF: start-up frequencies in Python floats, a forward's seq_len (a tensor) in float32 tensor math
        n = mpe if seq_len is None else torch.maximum(torch.tensor(seq_len), torch.tensor(mpe))
        base = spec.theta * ((factor * n / mpe) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / (base ** _exponents(dim, device)), 1.0
    if t == "llama3":
        return _llama3(spec, device), 1.0
    if t == "yarn":
        return _yarn(spec, device)
    if t == "longrope":
        long = seq_len is not None and seq_len > spec.original_max_position_embeddings
        ext = torch.tensor(spec.long_factor if long else spec.short_factor, dtype=torch.float32, device=device)
        return 1.0 / (ext * spec.theta ** _exponents(dim, device)), _longrope_attention(spec)
    if t == "proportional":  # transformers' _compute_proportional_rope_parameters
        angles = int(spec.proportion * dim // 2)
        exps = torch.arange(0, 2 * angles, 2, dtype=torch.int64, device=device).float() / dim
        inv = torch.cat((1.0 / (spec.theta ** exps), torch.zeros(dim // 2 - angles, device=device)))
        return inv / (spec.factor if spec.factor is not None else 1.0), 1.0
    raise ValueError(f"rope_type {t!r} is not supported")


def _angles(spec: RopeSpec, positions: int, device: torch.device) -> tuple[torch.Tensor, float]:
    """position * inv_freq for positions 0 .. positions - 1: [P, rotary_dim / 2] float32, attention factor."""
    pos = torch.arange(positions, dtype=torch.float32, device=device)
    inv, attention = inv_freq(spec, None, device)
    if spec.rope_type == "dynamic":
        start = spec.max_position_embeddings  # positions >= start: seq_len = p + 1 > the original window
        if positions > start:  # one HF computation per position (0-d tensor math: batched, it rounds differently)
            grown = [inv_freq(spec, p + 1, device)[0] for p in range(start, positions)]
            rows = torch.cat([inv.expand(start, -1), torch.stack(grown)])  # [P, dim / 2]
            return pos[:, None] * rows, attention
    elif spec.rope_type == "longrope":
        start = spec.original_max_position_embeddings
        if positions > start:
            long, _ = inv_freq(spec, start + 1, device)
            rows = torch.cat([inv.expand(start, -1), long.expand(positions - start, -1)])
            return pos[:, None] * rows, attention
    return torch.outer(pos, inv), attention


class Rotary:
    """Neox-style RoPE (rotate_half) on the leading rotary_dim lanes of each head. cos/sin are computed in
    float32 for every position (as HF does, times the attention factor) and kept in the model dtype, so a
    step only gathers its positions' rows. Default RoPE keeps the exact ops it always had (the C kernels'
    bit-identity tests pin them).

    A plain object, not a module: the model is built on the meta device and materialised with
    `to_empty`, which must not wipe these tables.
    """

    def __init__(self, spec: RopeSpec, max_positions: int, device: torch.device, dtype: torch.dtype):
        self.spec = spec
        self.rotary_dim = d = spec.rotary_dim
        if spec.rope_type == "default":
            inv = 1.0 / (spec.theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
            freqs, attention = torch.outer(torch.arange(max_positions, dtype=torch.float32, device=device), inv), 1.0
        else:
            freqs, attention = _angles(spec, max_positions, device)  # [P, d / 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [P, d]
        cos, sin = emb.cos(), emb.sin()[:, : d // 2]  # both halves of sin are equal
        if attention != 1.0:
            cos, sin = cos * attention, sin * attention
        self.cos = cos.to(dtype)  # [P, d]
        self.sin = sin.to(dtype)  # [P, d / 2]

    @property
    def full(self) -> bool:
        """Every lane of a head rotates: the layout the C kernels (rope_store.c, decode_layer.c) implement."""
        return not self.spec.partial

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Once per step: positions [T] -> cos [T, 1, d], sin [T, 1, d / 2]."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def cos_sin_mrope(self, positions: torch.Tensor, section: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """Multimodal rope (Qwen-VL): positions [3, T] (frame, row, column) -> cos [T, 1, d], sin [T, 1, d / 2];
        the rotary half's lanes in order split by `section`, the k-th part rotating by axis k % 3 (transformers'
        mrope_section)."""
        axis = torch.cat([torch.full((n,), k % 3, dtype=torch.int64) for k, n in enumerate(section)])
        axis = axis.to(positions.device)
        T = positions.shape[1]
        cos = self.cos[positions].gather(0, torch.cat([axis, axis]).expand(1, T, -1))[0]  # [T, d]
        sin = self.sin[positions].gather(0, axis.expand(1, T, -1))[0]  # [T, d / 2]
        return cos.unsqueeze(1), sin.unsqueeze(1)

    @staticmethod
    def apply(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x [T, heads, D] (q and k heads together) -> rotated x. The rotary width d is cos's last dim;
        lanes d .. D - 1 pass through unchanged (partial rotary).

        x * cos + rotate_half(x) * sin, written as one multiply and two half-width fused
        multiply-adds (rotate_half(x) = cat(-x2, x1) is never materialised).
        """
        cos, sin = cos_sin  # [T, 1, d], [T, 1, d/2]
        d = cos.shape[-1]
        if d < x.shape[-1]:
            out = x.clone()
            out[..., :d] = Rotary.apply(x[..., :d], cos_sin)
            return out
        h = d // 2
        x1, x2 = x[..., :h], x[..., h:]
        out = x * cos
        out[..., :h].addcmul_(x2, sin, value=-1.0)
        out[..., h:].addcmul_(x1, sin)
        return out
