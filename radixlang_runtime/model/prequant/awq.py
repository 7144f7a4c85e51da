"""AWQ checkpoints (quant_method "awq", AutoAWQ's GEMM layout), as AutoAWQ's WQLinear_GEMM writes them:

    qweight [K, N / 8] int32   4-bit codes packed along the output dim, 8 per word in AWQ's interleaved
                               order: word j's i-th nibble is column 8 j + ORDER[i], ORDER = 0 2 4 6 1 3 5 7
    qzeros  [K / g, N / 8] int32  zero points, packed the same way
    scales  [K / g, N] fp16
    W[n, k] = (q[k, n] - z[k / g, n]) * s[k / g, n]

zero_point false and the other versions (gemv, marlin, ...) are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from radixlang_runtime.model.prequant.weight import QuantWeight, group_index, narrow_int, unpack_int32

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds column AWQ_ORDER[i] of its 8
AWQ_REVERSE = (0, 4, 1, 5, 2, 6, 3, 7)  # column j of a word's 8 sits in nibble AWQ_REVERSE[j]


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """[R, C] int32 -> [R, 8 C] int32 codes in column order."""
    codes = unpack_int32(packed, 4, dim=1)  # [R, 8 C] in nibble order
    return codes.view(packed.shape[0], -1, 8)[:, :, list(AWQ_REVERSE)].reshape(packed.shape[0], -1)


@dataclass(frozen=True)
class AWQSpec:
    group_size: int
    method: str = "awq"

    @staticmethod
    def parse(qc: dict) -> "AWQSpec":
        bits = qc.get("bits", qc.get("w_bit", 4))
        if bits != 4:
            raise ValueError(f"quantization_config (awq): bits {bits!r} is not supported (4)")
        zero_point = qc.get("zero_point", True)
        if zero_point is not True:
            raise ValueError(f"quantization_config (awq): zero_point {zero_point!r} is not supported (true)")
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"quantization_config (awq): version {qc.get('version')!r} is not supported (gemm)")
        group = qc.get("group_size", qc.get("q_group_size", 128))
        if not isinstance(group, int) or group == 0 or group < -1:
            raise ValueError(f"quantization_config (awq): group_size {group!r} is not supported")
        return AWQSpec(group_size=group)

    def describe(self) -> str:
        return f"awq 4-bit g{self.group_size}"

    def read(self, tensors, prefix: str) -> Optional[QuantWeight]:
        if prefix + ".qweight" not in tensors:
            return None
        q = unpack_awq(tensors.get(prefix + ".qweight"))  # [K, N]
        z = unpack_awq(tensors.get(prefix + ".qzeros"))  # [G, N]
        scales = tensors.get(prefix + ".scales").float()  # [G, N]
        K = q.shape[0]
        g_idx = group_index(K, self.group_size)
        if z.shape != scales.shape or int(g_idx[-1]) >= scales.shape[0]:
            raise ValueError(f"{prefix}: awq qzeros {tuple(z.shape)} / scales {tuple(scales.shape)} do not fit "
                             f"{K} input columns in groups of {self.group_size}")
        values = narrow_int(q - z[g_idx]).t().contiguous()  # [N, K]
        return QuantWeight(values, scales.t().contiguous(), g_idx)
