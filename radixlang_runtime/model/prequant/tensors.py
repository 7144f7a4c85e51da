"""PrequantTensors: a SafetensorsDir whose `<linear>.weight` reads return the exact float32 values a
pre-quantized linear encodes (QuantWeight.dequantize), so every family's loader runs unchanged; each
record read stays in `records` (HF module name -> QuantWeight) for linear.py to keep the integer weights."""

from __future__ import annotations

from typing import Any, Optional

import torch

from radixlang_runtime.model.prequant.weight import QuantWeight
from radixlang_runtime.model.loader.weights import Range, SafetensorsDir


class PrequantTensors:
    def __init__(self, tensors: SafetensorsDir, spec: Any):
        self.inner = tensors
        self.path = tensors.path
        self.spec = spec  # awq.AWQSpec | gptq.GPTQSpec | compressed_tensors.CompressedTensorsSpec | fp8.FP8Spec
        self.records: dict[str, QuantWeight] = {}
        self._plain: set[str] = set()  # prefixes read and found not quantized

    def record(self, prefix: str) -> Optional[QuantWeight]:
        """The module `prefix`'s quantized weight (None: stored in float)."""
        if prefix in self.records:
            return self.records[prefix]
        if prefix in self._plain:
            return None
        got = self.spec.read(self.inner, prefix)
        if got is None:
            self._plain.add(prefix)
        else:
            self.records[prefix] = got
        return got

    def __contains__(self, name: str) -> bool:
        if name in self.inner:
            return True
        return name.endswith(".weight") and self.record(name[: -len(".weight")]) is not None

    def get(self, name: str, rows: Range = None, cols: Range = None) -> torch.Tensor:
        qw = self.record(name[: -len(".weight")]) if name.endswith(".weight") else None
        if qw is None:
            return self.inner.get(name, rows, cols)
        w = qw.dequantize()  # [N, K] float32
        if rows is not None:
            w = w[rows[0]:rows[1]]
        if cols is not None:
            w = w[:, cols[0]:cols[1]]
        return w
