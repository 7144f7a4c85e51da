"""Where a pre-quantized checkpoint meets the runner: the flags it cannot combine with (refused by name),
the tensor reader that records its quantized weights, and the linear path it reports."""

from __future__ import annotations

from typing import Any, Optional

from torch import nn

from radixlang_runtime.model.prequant.linear import DequantLinear
from radixlang_runtime.model.prequant.tensors import PrequantTensors
from radixlang_runtime.model.loader.weights import SafetensorsDir


def prequant_tensors(spec: Any, tensors: SafetensorsDir, args: Any, tp: Optional[Any]) -> PrequantTensors:
    """args: the ServerArgs; tp: the TPGroup (None: one rank)."""
    what = f"a pre-quantized checkpoint (quantization_config {spec.method})"
    if args.quantization is not None:
        raise ValueError(f"--quantization {args.quantization} is not supported with {what}: its own weights run")
    if tp is not None:
        raise ValueError(f"tp_size {tp.size} is not supported with {what} (use tp_size 1)")
    if args.enable_deterministic_inference:
        raise ValueError(f"enable_deterministic_inference is not supported with {what}: the decode batches "
                         "run on the quantized blocks, larger ones on a dense copy")
    return PrequantTensors(tensors, spec)


def prequant_paths(spec: Any, model: nn.Module) -> str:
    """The linear path the CPU paths report: how many linears run on Q8_0 blocks, how many dequantize
    per call."""
    from radixlang_runtime.model.layers.gguf_linear import GGUFLinear

    blocks = sum(isinstance(m, GGUFLinear) for m in model.modules())
    per_call = sum(isinstance(m, DequantLinear) for m in model.modules())
    return (f"{spec.describe()}: {blocks} on Q8_0 blocks (gguf kernels, M <= 16; dense above), "
            f"{per_call} dequantized per call")
