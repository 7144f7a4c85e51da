"""compressed-tensors checkpoints (quant_method "compressed-tensors", llm-compressor's output), weight-only:

- pack-quantized (W4A16 / W8A16 int, symmetric):
      weight_packed [N, ceil(K * bits / 32)] int32  codes + 2**(bits-1), packed along the input dim, lowest bits first
      weight_scale  [N, G] (group / channel) or [1] (tensor), the model dtype
      weight_shape  [2] = (N, K);  weight_g_idx [K] when actorder "group"
      W[n, k] = (code[n, k] - 2**(bits-1)) * s[n, g_idx[k]]
- int-quantized / naive-quantized: weight [N, K] int8 (the signed codes) + weight_scale, the same math;
- float-quantized (FP8 E4M3): weight [N, K] float8_e4m3fn + weight_scale per tensor, channel or block
  (strategy "block", block_structure [bn, bk]), read as fp8.py does.

Refused by name: input_activations / output_activations (activation quantization: W8A8), kv_cache_scheme,
symmetric false (packed zero points), sparsity, formats other than the four above, config_groups whose
weights schemes differ, a quantization_status other than compressed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from radixlang_runtime.model.prequant.fp8 import read_fp8
from radixlang_runtime.model.prequant.weight import QuantWeight, group_index, unpack_int32

INT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")
FORMATS = INT_FORMATS + ("float-quantized",)


def _refuse(field: str, value, why: str = "is not supported") -> ValueError:
    return ValueError(f"quantization_config (compressed-tensors): {field} {value!r} {why}")


@dataclass(frozen=True)
class CompressedTensorsSpec:
    fmt: str
    kind: str  # "int" | "float"
    bits: int
    strategy: str  # "group" | "channel" | "tensor" | "block"
    group_size: int  # strategy group; -1 otherwise
    block: Optional[tuple[int, int]]  # strategy block
    method: str = "compressed-tensors"

    @staticmethod
    def parse(qc: dict) -> "CompressedTensorsSpec":
        for key in ("kv_cache_scheme", "transform_config"):
            if qc.get(key):
                raise _refuse(key, qc[key])
        status = qc.get("quantization_status", "compressed")
        if status != "compressed":
            raise _refuse("quantization_status", status, "is not supported (compressed)")
        sparsity = qc.get("sparsity_config") or {}
        if sparsity and sparsity.get("format", "dense") != "dense":
            raise _refuse("sparsity_config format", sparsity.get("format"))
        groups = qc.get("config_groups") or {}
        if not groups:
            raise _refuse("config_groups", groups, "is empty")
        schemes = []
        for name, group in groups.items():
            for key in ("input_activations", "output_activations"):
                if group.get(key) is not None:
                    raise _refuse(f"config_groups.{name}.{key}", group[key],
                                  "is not supported (activation quantization, e.g. W8A8; weight-only schemes run)")
            fmt = group.get("format") or qc.get("format")
            schemes.append((fmt, tuple(sorted((group.get("weights") or {}).items(), key=lambda kv: kv[0]))))
        if len(set(map(repr, schemes))) != 1:
            raise _refuse("config_groups", sorted(groups), "with different weights schemes is not supported")
        fmt, weights = schemes[0][0], dict(schemes[0][1])
        return CompressedTensorsSpec._from_weights(fmt, weights)

    @staticmethod
    def _from_weights(fmt: Optional[str], w: dict) -> "CompressedTensorsSpec":
        if fmt not in FORMATS:
            raise _refuse("format", fmt, f"is not supported ({', '.join(FORMATS)})")
        kind, bits = w.get("type", "int"), w.get("num_bits", 8)
        if (kind, fmt in INT_FORMATS) not in (("int", True), ("float", False)):
            raise _refuse("weights.type", kind, f"does not match format {fmt!r}")
        if (kind == "int" and bits not in (4, 8)) or (kind == "float" and bits != 8):
            raise _refuse("weights.num_bits", bits)
        if w.get("symmetric", True) is not True:
            raise _refuse("weights.symmetric", w.get("symmetric"), "is not supported (true: no zero points)")
        if w.get("dynamic", False):
            raise _refuse("weights.dynamic", w.get("dynamic"))
        strategy = w.get("strategy", "tensor")
        allowed = ("group", "channel", "tensor") + (("block",) if kind == "float" else ())
        if strategy not in allowed:
            raise _refuse("weights.strategy", strategy, f"is not supported ({', '.join(allowed)})")
        group = w.get("group_size") if strategy == "group" else -1
        if strategy == "group" and (not isinstance(group, int) or group <= 0):
            raise _refuse("weights.group_size", group)
        block = w.get("block_structure") if strategy == "block" else None
        if strategy == "block" and (not block or len(block) != 2):
            raise _refuse("weights.block_structure", block)
        return CompressedTensorsSpec(fmt=fmt, kind=kind, bits=bits, strategy=strategy, group_size=group,
                                     block=tuple(block) if block else None)

    def describe(self) -> str:
        what = f"g{self.group_size}" if self.strategy == "group" else self.strategy
        return f"compressed-tensors {self.fmt} {self.kind}{self.bits} {what}"

    def read(self, tensors, prefix: str) -> Optional[QuantWeight]:
        if self.kind == "float":
            return read_fp8(tensors, prefix, (".weight_scale",), self.block)
        if prefix + ".weight_packed" in tensors:
            N, K = (int(v) for v in tensors.get(prefix + ".weight_shape").tolist())
            codes = unpack_int32(tensors.get(prefix + ".weight_packed"), self.bits, dim=1)[:, :K]
            values = (codes - (1 << (self.bits - 1))).to(torch.int8)  # [N, K]
        elif prefix + ".weight_scale" in tensors and prefix + ".weight" in tensors:
            values = tensors.get(prefix + ".weight")
            if values.dtype != torch.int8:
                raise ValueError(f"{prefix}.weight is {values.dtype}, not the int8 codes {self.fmt} stores")
        else:
            return None
        N, K = values.shape
        s = tensors.get(prefix + ".weight_scale").float()
        s = s.reshape(1, 1).expand(N, 1).contiguous() if s.numel() == 1 else s.reshape(N, -1).contiguous()
        if prefix + ".weight_g_idx" in tensors:
            g_idx = tensors.get(prefix + ".weight_g_idx").long()
        else:
            g_idx = group_index(K, self.group_size if s.shape[1] > 1 else -1)
        return QuantWeight(values, s, g_idx)
