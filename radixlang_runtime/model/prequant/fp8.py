"""FP8 checkpoints (quant_method "fp8": DeepSeek-V3 / Qwen3-FP8 style), and the FP8 reading the
compressed-tensors float-quantized format shares:

    weight            [N, K] float8_e4m3fn
    weight_scale_inv  [ceil(N / bn), ceil(K / bk)] float32 (weight_block_size [bn, bk], e.g. 128 x 128),
                      or one per tensor (no weight_block_size; also spelled weight_scale)
    W[n, k] = weight[n, k] * scale[n / bn, k / bk]      (despite its name, scale_inv multiplies)

activation_scheme "dynamic" (activations quantized per token group at run time on FP8 GEMMs) runs here with
the activations in the model dtype: the weights are exact, the activations are not rounded to FP8.
"static" (checkpointed activation scales) and fmt other than e4m3 are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from radixlang_runtime.model.prequant.weight import QuantWeight, group_index


def read_fp8(tensors, prefix: str, scale_names: tuple[str, ...], block: Optional[tuple[int, int]]
             ) -> Optional[QuantWeight]:
    """prefix.weight in float8_e4m3fn with the first of scale_names present: per tensor ([] / [1]), per
    output channel ([N] / [N, 1]) or per block (block [bn, bk]: [ceil(N / bn), ceil(K / bk)])."""
    name = prefix + ".weight"
    if name not in tensors:
        return None
    w = tensors.get(name)
    if w.dtype != torch.float8_e4m3fn:
        return None
    scale_name = next((prefix + s for s in scale_names if prefix + s in tensors), None)
    if scale_name is None:
        raise ValueError(f"{name} is float8_e4m3fn without a {'/'.join(scale_names)} scale")
    s = tensors.get(scale_name).float()
    N, K = w.shape
    if block is not None and tuple(s.shape) == (-(-N // block[0]), -(-K // block[1])):
        return QuantWeight(w, s.repeat_interleave(block[0], dim=0)[:N].contiguous(), group_index(K, block[1]))
    if s.numel() == 1:
        return QuantWeight(w, s.reshape(1, 1).expand(N, 1).contiguous(), group_index(K, -1))
    if s.numel() == N:
        return QuantWeight(w, s.reshape(N, 1).contiguous(), group_index(K, -1))
    raise ValueError(f"{scale_name} {tuple(s.shape)} is neither per tensor, per channel nor per {block} block "
                     f"for a [{N}, {K}] weight")


@dataclass(frozen=True)
class FP8Spec:
    block: Optional[tuple[int, int]]  # weight_block_size [bn, bk]; None: per tensor
    method: str = "fp8"

    @staticmethod
    def parse(qc: dict) -> "FP8Spec":
        fmt = qc.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ValueError(f"quantization_config (fp8): fmt {fmt!r} is not supported (e4m3)")
        scheme = qc.get("activation_scheme", "dynamic")
        if scheme != "dynamic":
            raise ValueError(f"quantization_config (fp8): activation_scheme {scheme!r} is not supported (dynamic)")
        block = qc.get("weight_block_size")
        if block is not None and (len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block)):
            raise ValueError(f"quantization_config (fp8): weight_block_size {block!r} is not supported")
        return FP8Spec(block=tuple(block) if block is not None else None)

    def describe(self) -> str:
        return "fp8 e4m3 " + (f"block {self.block[0]}x{self.block[1]}" if self.block else "per tensor")

    def read(self, tensors, prefix: str) -> Optional[QuantWeight]:
        return read_fp8(tensors, prefix, (".weight_scale_inv", ".weight_scale"), self.block)
