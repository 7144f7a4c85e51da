"""CPU linears with oneDNN-prepacked weights (bf16 and float32).

bf16: F.linear on CPU reorders a bf16 weight into oneDNN's blocked layout on every call; packing once
at load time (the path torch.compile's CPU backend uses after freezing) removes that cost at every
batch size, most at M=1, with bit-identical outputs.

float32: F.linear runs MKL's sgemm, which streams weights from memory well below a plain read's
bandwidth; oneDNN's packed fp32 GEMM (AVX-512 or AVX2 kernels, no bf16 instructions needed) is faster
at every M measured, the tied head included. A batch-size hint of 16 packs best for every M measured
(1 .. 1024; hint 1 loses at M >= 64). Sums are ordered differently from MKL's, so fp32 logits differ
from transformers' in the last bits (greedy parity tests still hold token for token).

Decode-sized batches (M <= cpu_ops.DENSE_MAX_M) run gemv_dense.c on a second, tiled copy of the
weight (`tiles=True`; the runner asks for it wherever the C kernels load, except in the deterministic
mode): decode is bandwidth-bound and oneDNN's packed GEMV streams well below the read bandwidth; the
tiles are faster for every shape measured, bf16 and float32, at the read bandwidth at M = 1. On
VDPBF16PS builds the bf16 tiles serve every batch size through a GEMM micro-kernel
(cpu_ops.dense_any_m), faster than oneDNN's GEMM at M = 64 and level with it at M = 512, so those
weights keep no oneDNN copy; float32 tiles do the same on AVX-512 builds (the FMA twin of that
micro-kernel: faster at M = 64, level at large M). Elsewhere the tiles serve M <= DENSE_MAX_M and a
oneDNN copy the rest (the weights are held twice).
Figures: docs/PERFORMANCE.md#cpu-linears.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch
from torch import nn

from radixlang_kernels import cpu_ops

logger = logging.getLogger(__name__)


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """float32 on any CPU oneDNN supports; bf16 where oneDNN has a bf16 path (AVX-512 BW/VL/DQ or
    AVX-NE-CONVERT: on an AVX2-only CPU, or with oneDNN capped there by the capability mask, the bf16
    reorder raises). Else plain F.linear."""
    if not (device.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinear(nn.Module):
    # The deterministic mode: a single row runs as two (oneDNN's M = 1 path orders fp32 sums
    # differently from every M >= 2; measured, see model/executor/deterministic.py).
    pad_single_row = False

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, tiles: bool = False):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else bias.detach()
        # cpu_ops.dense_tiles(weight) (see the module docstring), or None; any_m: the tiles serve every
        # batch size, and no oneDNN copy is kept
        self.tiles: Optional[torch.Tensor] = None
        self.any_m = False
        if tiles and (weight.dtype == torch.float32 or self.in_features % 2 == 0):
            self.tiles = cpu_ops.dense_tiles(weight)
            self.any_m = cpu_ops.dense_any_m(weight.dtype)
        # [out, in] in oneDNN's blocked layout (an opaque mkldnn tensor); batch-size hint: see above.
        self.packed: Optional[torch.Tensor] = None
        if not self.any_m:
            hint = 16 if weight.dtype == torch.float32 else 1
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), hint)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tiles is not None and (self.any_m or x.shape[0] <= cpu_ops.DENSE_MAX_M):
            y = cpu_ops.dense_gemv(x, self.tiles, self.out_features, self.bias)
            if y is not None:
                return y
        if self.pad_single_row and x.shape[0] == 1:
            return self._run(x.expand(2, -1))[:1]
        return self._run(x)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")


def replace_linears(module: nn.Module, make: Callable[[torch.Tensor, Optional[torch.Tensor]], nn.Module]) -> int:
    """Replace every nn.Linear under `module` by make(weight, bias), and a mixture-of-experts block's stacked
    expert weights by one make(weight, bias) per expert projection (its `pack_experts`); returns how many."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, make(child.weight, child.bias))
            count += 1
            continue
        if hasattr(child, "pack_experts"):  # model/moe.SparseMoE (the router stays exact: not a linear)
            count += child.pack_experts(make)
        count += replace_linears(child, make)
    return count


def dense_tiles_available(device: torch.device, dtype: torch.dtype) -> bool:
    """gemv_dense.c runs here: the CPU kernels loaded, bf16 or float32."""
    return device.type == "cpu" and dtype in (torch.bfloat16, torch.float32) and cpu_ops.load() is not None


def pack_linears(module: nn.Module, tiles: bool = False) -> int:
    """Replace every nn.Linear under `module` by a PackedLinear (with dense tiles: see above); returns how many."""
    return replace_linears(module, lambda w, b: PackedLinear(w, b, tiles))
