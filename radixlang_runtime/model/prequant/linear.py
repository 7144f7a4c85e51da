"""Linears on a pre-quantized checkpoint's own weights (QuantWeight records), swapped in after the model
loaded their exact float values.

- integer codes (AWQ, GPTQ, compressed-tensors int) whose groups cover whole runs of 32 input columns
  and whose scales are exact in fp16: GGUF Q8_0 blocks (d = the group's scale, 32 int8 codes minus their
  zero point), run by gguf_linear.GGUFLinear: decode batches on the blocks (float32: gemv.c's float sums,
  the exact dequantized values; bf16: gemv_q8.c with int8 activations, llama.cpp's scheme), larger ones
  on a dense copy. Act-order groups (GPTQ desc_act g_idx) are made contiguous by permuting the input
  columns once (the activations are gathered in the same order per call: PermutedInput);
- anything else (FP8, scales that fp16 would round, groups not a multiple of 32): DequantLinear, the
  weights dequantized per call in torch.
q/k/v and gate/up fuse when their parts share the column order; a linear whose parts are not all quantized
(or differ in order) keeps a dense weight. The model's layers must be Llama-shaped (self_attn.qkv_proj,
o_proj, mlp.gate_up_proj, down_proj); other blocks (MoE experts, fused-checkpoint families) run on the
dense dequantized values.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from radixlang_runtime.model.layers.gguf_linear import GGUFLinear
from radixlang_runtime.model.layers.packed_linear import PackedLinear, packing_available
from radixlang_runtime.model.prequant.weight import QuantWeight


class DequantLinear(nn.Module):
    """y = x @ dequantize(W).T (+ bias), W kept as stored (int codes or FP8)."""

    def __init__(self, qw: QuantWeight, bias: Optional[torch.Tensor]):
        super().__init__()
        self.out_features, self.in_features = qw.shape
        self.values, self.scale, self.g_idx = qw.values, qw.scale, qw.g_idx
        self.bias = None if bias is None else bias.detach()
        G, K = qw.scale.shape[1], self.in_features
        # contiguous equal groups: the scales broadcast over a [N, G, K / G] view (no [N, K] gather per call)
        self.group = K // G if K % G == 0 and torch.equal(qw.g_idx, torch.arange(K) // (K // G)) else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        N, K = self.out_features, self.in_features
        if self.group:
            w = (self.values.float().view(N, -1, self.group) * self.scale[:, :, None]).view(N, K)
        else:
            w = self.values.float() * self.scale[:, self.g_idx]
        return F.linear(x, w.to(x.dtype), self.bias)  # w [N, K]


class PermutedInput(nn.Module):
    """inner(x[:, perm]): a linear whose input columns were reordered (act-order groups made contiguous)."""

    def __init__(self, inner: nn.Module, perm: torch.Tensor):
        super().__init__()
        self.inner, self.perm = inner, perm
        self.out_features, self.in_features = inner.out_features, inner.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.index_select(-1, self.perm))


def fuse(parts: list[QuantWeight]) -> Optional[QuantWeight]:
    """Stack the parts' rows (q/k/v, gate/up); None when their column groups or value types differ."""
    first = parts[0]
    if any(p.values.dtype != first.values.dtype or not torch.equal(p.g_idx, first.g_idx)
           or p.scale.shape[1] != first.scale.shape[1] for p in parts[1:]):
        return None
    if len(parts) == 1:
        return first
    return QuantWeight(torch.cat([p.values for p in parts]), torch.cat([p.scale for p in parts]), first.g_idx)


def q8_0_blocks(qw: QuantWeight) -> Optional[tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """(blocks [N, K / 32 * 34] uint8 in GGUF Q8_0 layout, the column order or None) where the values are
    exactly Q8_0's: int8 codes, one fp16-exact scale per run of 32 (reordered) columns; else None."""
    N, K = qw.shape
    if qw.values.dtype != torch.int8 or K % 32:
        return None
    g, perm = qw.g_idx, None
    if K > 1 and bool((g[1:] < g[:-1]).any()):
        perm = torch.argsort(g, stable=True)
        g = g[perm]
    gb = g.view(K // 32, 32)  # [blocks, 32]
    if not bool((gb == gb[:, :1]).all()):
        return None
    d = qw.scale[:, gb[:, 0]]  # [N, blocks] float32
    d16 = d.half()
    if not torch.equal(d16.float(), d):
        return None
    values = qw.values if perm is None else qw.values[:, perm]
    blocks = torch.cat([d16.contiguous().view(torch.uint8).view(N, K // 32, 2),
                        values.contiguous().view(torch.uint8).view(N, K // 32, 32)], dim=2)  # [N, blocks, 34]
    return blocks.reshape(N, K // 32 * 34).contiguous(), perm


def make_linear(parts: list[QuantWeight], weight: torch.Tensor, bias: Optional[torch.Tensor]) -> Optional[nn.Module]:
    """The linear over `parts` stacked (weight [N, K]: their dequantized values, model dtype); None where
    they cannot share one (fuse)."""
    qw = fuse(parts)
    if qw is None:
        return None
    got = q8_0_blocks(qw)
    if got is None:
        return DequantLinear(qw, bias)
    blocks, perm = got
    if perm is None:
        return GGUFLinear(weight.detach(), bias, blocks, "Q8_0")
    return PermutedInput(GGUFLinear(weight.detach()[:, perm].contiguous(), bias, blocks, "Q8_0"), perm)


def swap_linears(model: nn.Module, records: dict[str, QuantWeight], tiles: bool) -> int:
    """Every Llama-shaped projection and the output head whose checkpoint parts are all quantized runs on
    them; the others get a packed dense weight where oneDNN packs the dtype. Returns how many swapped."""
    w0 = model.embed_tokens.weight
    pack = packing_available(w0.device, w0.dtype)

    def swap(owner: nn.Module, attr: str, names: list[str]) -> int:
        lin = getattr(owner, attr, None)
        if not isinstance(lin, nn.Linear):
            return 0
        parts = [records.get(n) for n in names]
        made = make_linear(parts, lin.weight, lin.bias) if all(p is not None for p in parts) else None
        if made is not None:
            setattr(owner, attr, made)
            return 1
        if pack:
            setattr(owner, attr, PackedLinear(lin.weight, lin.bias, tiles))
        return 0

    n = 0
    for i, layer in enumerate(model.layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        n += swap(layer.self_attn, "qkv_proj", [a + "q_proj", a + "k_proj", a + "v_proj"])
        n += swap(layer.self_attn, "o_proj", [a + "o_proj"])
        n += swap(layer.mlp, "gate_up_proj", [m + "gate_proj", m + "up_proj"])
        n += swap(layer.mlp, "down_proj", [m + "down_proj"])
    w = w0 if model.lm_head is None else model.lm_head.weight
    head = records.get("lm_head") if model.lm_head is not None else None
    made = make_linear([head], w, None) if head is not None else None
    if made is not None:
        model.head, model.lm_head = made, None
        n += 1
    elif pack:
        model.head, model.lm_head = PackedLinear(w, None, tiles), None
    return n
