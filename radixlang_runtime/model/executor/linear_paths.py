"""The `linear` entry of the CPU paths (/server_info, the start log) for a model under --quantization: which
kernel runs decode-sized batches and what runs the larger ones, read from the linears the model holds."""

from __future__ import annotations

import torch
from torch import nn

from radixlang_kernels import cpu_ops, quant_ops
from radixlang_kernels.cpu_caps import detect
from radixlang_runtime.model.layers.gguf_linear import GGUFLinear


def quantized_linear_paths(quantization: str, model: nn.Module, dtype: torch.dtype, device: torch.device,
                           gguf_types: list[str]) -> str:
    kernel = f"c:{detect().isa}" if cpu_ops.load() is not None and device.type == "cpu" else "torch"
    fmt = "int8" if quantization == "int8" else f"gguf {'/'.join(gguf_types)} blocks"
    modules = list(model.modules())
    if any(getattr(m, "q8", False) for m in modules):  # gemv_q8.c (gguf_linear, quant_linear)
        kernel += " x int8 activations"
    above = "dense tiles" if cpu_ops.dense_any_m(dtype, cpu_ops.load()) else "oneDNN-prepacked"
    if any(hasattr(m, "fmts") for m in modules):  # gguf_block_linear: no dense copy
        above += " / per-call tiles of the blocks"
    # gemm_kquant.c below the tiles: gguf_block_linear's bf16 batches, and a bf16 GGUFLinear's through it
    if any((hasattr(m, "fmts") or isinstance(m, GGUFLinear)) and m.q8 for m in modules):
        rows = quant_ops.kq_gemm_max_m()
        above = f"int8 GEMM on the blocks ({f'M <= {rows}' if rows <= quant_ops.KQ_GEMM_MAX_M else 'any M'}), {above}"
    return f"{fmt}:{kernel} (M <= 16), {above} dequantized above"
