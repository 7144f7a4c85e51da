"""Weight-only int8 linears (`--quantization int8`, SGLang's flag name): per-output-channel symmetric
int8 weights, activations and outputs stay in the model dtype.

    scale[n] = max_k |W[n, k]| / 127,  Q[n, k] = round(W[n, k] / scale[n])  (int8 in [-127, 127])
    y = x @ (Q * scale).T

Decode batches (M <= quant_ops.QLINEAR_MAX_M) run a C kernel that reads Q directly (half the bytes of bf16
per step: decode is bandwidth-bound): on bf16 models gemv_q8.c on Q repacked into 4-row tiles (int8_q8_tiles),
activations quantized to int8 per block of 32 (integer dots, as --quantization gguf; their rounding adds to
the weights'), elsewhere (float32 models, K % 32 != 0) gemv.c's float sums on Q. On bf16 models the integer dots are
much faster than the float sums. Larger batches are compute-bound,
where a GEMV-style kernel loses to oneDNN's GEMM: they run a oneDNN-prepacked copy of the dequantized weights
(Q * scale in the model dtype) when oneDNN can pack that dtype, else convert Q per call and scale the columns.
So on CPU the flag trades memory (int8 + the packed copy) for decode speed (figures:
docs/PERFORMANCE.md#quantized-linears). The tied output head gets its own int8 copy;
the embedding lookup keeps the model-dtype table. Numerics: the int8 rounding of each weight (relative error
per channel <= 1 / 254) changes logits slightly, so greedy text can drift from the unquantized model's.
"""

from __future__ import annotations

import torch
from torch import nn

from radixlang_kernels import cpu_ops, quant_ops
from radixlang_runtime.model.layers.packed_linear import PackedLinear, packing_available, replace_linears



def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (q [N, K] int8, scale [N] float32)."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


class Int8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        q, scale = quantize_int8(weight)
        self.register_buffer("scale", scale)  # [N] float32
        self.bias = None if bias is None else bias.detach()
        self.dense: nn.Module | None = None  # batches above the kernel's M (see the module docstring)
        if packing_available(weight.device, weight.dtype):
            self.dense = PackedLinear((q.float() * scale[:, None]).to(weight.dtype), self.bias,
                                      tiles=cpu_ops.dense_any_m(weight.dtype, cpu_ops.load()))
        # bf16 (C kernels, K % 32 == 0): Q as gemv_q8.c's tiles; Q [N, K] int8 is kept only where a batch
        # above the kernel's M has no packed copy to run on (no oneDNN bf16: AVX2 CPUs), for the per-call path
        self.q8 = weight.dtype == torch.bfloat16 and self.in_features % 32 == 0 and cpu_ops.load() is not None
        self.tiles: torch.Tensor | None = quant_ops.int8_q8_tiles(q) if self.q8 else None
        self.qweight: torch.Tensor | None = None if self.q8 and self.dense is not None else q

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = None
        if x.device.type == "cpu":
            y = (quant_ops.int8_q8_gemv(x, self.tiles, self.scale) if self.q8
                 else quant_ops.qlinear_int8(x, self.qweight, self.scale))
        if y is None and self.dense is not None:
            return self.dense(x)
        if y is None:
            y = torch.nn.functional.linear(x, self.qweight.to(x.dtype)) * self.scale.to(x.dtype)
        return y if self.bias is None else y + self.bias


def quantize_linears(module: nn.Module) -> int:
    """Replace every nn.Linear under `module` by an Int8Linear; returns how many."""
    return replace_linears(module, Int8Linear)
