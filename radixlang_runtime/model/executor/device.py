"""The device and dtype a server runs on, from its flags ("auto" resolved from what the machine has)."""

from __future__ import annotations

import torch

from radixlang_kernels.cpu_caps import detect

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on GPU and on CPUs with bf16 dot products in hardware (AVX512-BF16 / AMX);
    float32 on every other CPU: without them oneDNN's bf16 GEMM runs at a fraction of its fp32 rate,
    so a bf16 model there runs slower than the same model in fp32, whose path (oneDNN-prepacked
    linears, C norm/activation/attention) also beats transformers' fp32 (figures, on a Xeon and on this
    project's CPU with AVX512-BF16 masked: docs/PERFORMANCE.md#dtype-per-cpu)."""
    if name != "auto":
        return _DTYPES[name]
    if device.type != "cpu" or detect().native_bf16:
        return torch.bfloat16
    return torch.float32


def gguf_blocks_dtype(name: str, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """auto for a model served on a .gguf file's blocks: bfloat16 wherever the C kernels' int8 dot products
    run (AVX2 or AVX-512), native bf16 or not. Those linears quantize their activations to int8 per block as
    llama.cpp's do, and only a bf16 model runs them (float32 keeps the dequantized values exactly: float sums,
    several times slower; `--dtype float32` asks for it). Figures: docs/MODELS.md#a-real-q4_k_m-file."""
    from radixlang_kernels import cpu_ops

    if name != "auto" or device.type != "cpu" or detect().isa == "scalar" or cpu_ops.load() is None:
        return dtype
    return torch.bfloat16
