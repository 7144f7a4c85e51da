"""GPTQ checkpoints (quant_method "gptq"), as AutoGPTQ / GPTQModel / optimum write them:

    qweight [K * bits / 32, N] int32  codes packed along the input dim: word row r's i-th code is row 32 r / bits + i
    qzeros  [G, N * bits / 32] int32  zero points packed along the output dim; checkpoint_format "gptq" (v1)
                                      stores zero - 1, "gptq_v2" the zero itself
    scales  [G, N] fp16
    g_idx   [K] int32                 each input column's group (act order: desc_act true permutes them)
    W[n, k] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]

bits 4 and 8; group_size -1 is one group per output channel. g_idx is honoured whenever the checkpoint
holds it (desc_act true needs it). Marlin / other packings are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from radixlang_runtime.model.prequant.weight import QuantWeight, group_index, narrow_int, unpack_int32


@dataclass(frozen=True)
class GPTQSpec:
    bits: int
    group_size: int
    desc_act: bool
    zeros_minus_one: bool  # checkpoint_format "gptq" (v1)
    method: str = "gptq"

    @staticmethod
    def parse(qc: dict) -> "GPTQSpec":
        bits = qc.get("bits", 4)
        if bits not in (4, 8):
            raise ValueError(f"quantization_config (gptq): bits {bits!r} is not supported (4, 8)")
        group = qc.get("group_size", 128)
        if not isinstance(group, int) or group == 0 or group < -1:
            raise ValueError(f"quantization_config (gptq): group_size {group!r} is not supported")
        fmt = qc.get("checkpoint_format") or qc.get("format") or "gptq"
        if fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"quantization_config (gptq): checkpoint_format {fmt!r} is not supported "
                             "(gptq, gptq_v2)")
        if qc.get("is_marlin_format"):
            raise ValueError("quantization_config (gptq): is_marlin_format true is not supported")
        return GPTQSpec(bits=bits, group_size=group, desc_act=bool(qc.get("desc_act", False)),
                        zeros_minus_one=fmt == "gptq")

    def describe(self) -> str:
        return f"gptq {self.bits}-bit g{self.group_size}" + (" act-order" if self.desc_act else "")

    def read(self, tensors, prefix: str) -> Optional[QuantWeight]:
        if prefix + ".qweight" not in tensors:
            return None
        q = unpack_int32(tensors.get(prefix + ".qweight"), self.bits, dim=0)  # [K, N]
        z = unpack_int32(tensors.get(prefix + ".qzeros"), self.bits, dim=1)  # [G, N (+ padding)]
        scales = tensors.get(prefix + ".scales").float()  # [G, N]
        K, N = q.shape
        z = z[:, :N] + (1 if self.zeros_minus_one else 0)
        if prefix + ".g_idx" in tensors:
            g_idx = tensors.get(prefix + ".g_idx").long()
        elif self.desc_act:
            raise ValueError(f"{prefix}: desc_act true needs the checkpoint's {prefix}.g_idx")
        else:
            g_idx = group_index(K, self.group_size)
        if z.shape != scales.shape or g_idx.shape != (K,) or int(g_idx.max()) >= scales.shape[0]:
            raise ValueError(f"{prefix}: gptq qzeros {tuple(z.shape)} / scales {tuple(scales.shape)} / g_idx "
                             f"{tuple(g_idx.shape)} do not fit a [{K}, {N}] qweight")
        values = narrow_int(q - z[g_idx]).t().contiguous()  # [N, K]
        return QuantWeight(values, scales.t().contiguous(), g_idx)
