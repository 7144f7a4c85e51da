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
