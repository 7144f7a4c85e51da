"""Pre-quantized HF checkpoints: config.json's quantization_config read into a spec (awq.py, gptq.py,
compressed_tensors.py, fp8.py), each linear's stored layout unpacked into one QuantWeight record
(weight.py), the model loaded on their exact float values (tensors.py), then its linears swapped for ones
that keep the integer / FP8 weights (linear.py)."""

from __future__ import annotations

from typing import Any, Optional

METHODS = ("awq", "gptq", "compressed-tensors", "fp8")


def parse_quant_config(qc: Any) -> Optional[Any]:
    """config.json's quantization_config -> its spec (None when absent); what is not implemented is
    refused by name (ValueError)."""
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ValueError(f"quantization_config must be an object, got {type(qc).__name__}")
    method = qc.get("quant_method")
    if method == "awq":
        from radixlang_runtime.model.prequant.awq import AWQSpec

        return AWQSpec.parse(qc)
    if method == "gptq":
        from radixlang_runtime.model.prequant.gptq import GPTQSpec

        return GPTQSpec.parse(qc)
    if method == "compressed-tensors":
        from radixlang_runtime.model.prequant.compressed_tensors import CompressedTensorsSpec

        return CompressedTensorsSpec.parse(qc)
    if method == "fp8":
        from radixlang_runtime.model.prequant.fp8 import FP8Spec

        return FP8Spec.parse(qc)
    raise ValueError(f"quantization_config ({method}): quant_method {method!r} is not supported "
                     f"({', '.join(METHODS)}; see --quantization for quantizing a float checkpoint at load)")
