"""QuantWeight: one linear's pre-quantized weight as the checkpoint stores it, unpacked once at load.

    W[n, k] = values[n, k] * scale[n, g_idx[k]]      (float32; the linear's weight [N, K] = [out, in])

values are the integer codes minus their zero point (int8, or int16 where 8-bit codes with a zero point
leave int8's range) or FP8 E4M3 numbers (torch.float8_e4m3fn); scale [N, G] float32 holds the checkpoint's
scales (fp16 / bf16 / float32, upcast exactly); g_idx [K] int64 maps each input column to its group
(k // group_size, or GPTQ's act-order g_idx). Every layout (awq.py, gptq.py, compressed_tensors.py, fp8.py)
reads into this one record, so the linears (linear.py) and the float values the model loads (tensors.py)
are shared.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class QuantWeight:
    values: torch.Tensor  # [N, K] int8 / int16 (code - zero point) or float8_e4m3fn
    scale: torch.Tensor  # [N, G] float32
    g_idx: torch.Tensor  # [K] int64: column -> group

    def __post_init__(self):
        N, K = self.values.shape
        if self.scale.dim() != 2 or self.scale.shape[0] != N or self.g_idx.shape != (K,):
            raise ValueError(f"quantized weight [{N}, {K}]: scale {tuple(self.scale.shape)} / g_idx "
                             f"{tuple(self.g_idx.shape)} do not fit")
        if K and (int(self.g_idx.min()) < 0 or int(self.g_idx.max()) >= self.scale.shape[1]):
            raise ValueError(f"quantized weight [{N}, {K}]: g_idx names groups outside the {self.scale.shape[1]} "
                             "scales")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.values.shape)

    def dequantize(self) -> torch.Tensor:
        """[N, K] float32: the exact values the checkpoint encodes."""
        return self.values.float() * self.scale[:, self.g_idx]


def group_index(k: int, group_size: int) -> torch.Tensor:
    """[K] int64: k // group_size (group_size <= 0: one group, per output channel)."""
    if group_size <= 0:
        return torch.zeros(k, dtype=torch.int64)
    return torch.arange(k, dtype=torch.int64) // group_size


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words holding 32 / bits codes each, lowest bits first, unpacked along `dim` (0: rows, 1:
    columns) -> int32 codes in [0, 2**bits): word j's i-th code is element j * (32 / bits) + i."""
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)  # [per]
    mask = (1 << bits) - 1
    if dim == 1:
        out = (packed.to(torch.int32).unsqueeze(2) >> shifts) & mask  # [R, C, per]
        return out.reshape(packed.shape[0], packed.shape[1] * per)
    out = (packed.to(torch.int32).unsqueeze(1) >> shifts[:, None]) & mask  # [R, per, C]
    return out.reshape(packed.shape[0] * per, packed.shape[1])


def narrow_int(values: torch.Tensor) -> torch.Tensor:
    """int8 where every value fits, else int16 (8-bit codes minus a zero point)."""
    if values.numel() == 0 or (int(values.min()) >= -128 and int(values.max()) <= 127):
        return values.to(torch.int8)
    return values.to(torch.int16)
