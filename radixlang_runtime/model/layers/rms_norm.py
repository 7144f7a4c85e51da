"""RMSNorm over the last axis, with the fused residual add the decoders use (a C pass for bf16 on the CPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlang_kernels import cpu_ops


class RMSNorm(nn.Module):
    """`forward(x)` normalises x; `add_forward(x, residual)` first does residual += x (in place)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.use_cpu_kernel = False  # bf16 on CPU: one C pass for the add and the norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # float32 statistics inside; HF rounds to the input dtype before the weight multiply, so
        # bf16 results may differ from HF in the last bit.
        if self.use_cpu_kernel and x.dim() == 2 and x.is_contiguous():
            return cpu_ops.add_rms_norm(None, x, self.weight, self.eps)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if self.use_cpu_kernel:
            return cpu_ops.add_rms_norm(x, residual, self.weight, self.eps)
        residual.add_(x)
        return self.forward(residual)
