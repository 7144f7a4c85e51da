"""The gated feed-forward of the Llama family: down(silu(gate) * up), gate and up fused in one matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlang_kernels import cpu_ops
from radixlang_runtime.model.executor.parallel import Reduce, Shard
from radixlang_runtime.model.loader.config import ModelConfig


class MLP(nn.Module):
    """down(silu(gate) * up), in blocks of at most ROWS token rows: a block's [ROWS, 2I] intermediate stays in
    the caches between the three ops, where a 4,096-token chunk's (50 MB in float32) went to DRAM and back
    twice and was a fresh mmap per call (its page faults made gate_up at M = 4,096 slower per FLOP than at
    M = 2,048: docs/PERFORMANCE.md#mlp-row-blocks). Each row's arithmetic is the same either way with the
    row-invariant linears."""

    ROWS = 512

    def __init__(self, cfg: ModelConfig, shard: Shard, reduce: Reduce):
        super().__init__()
        self.inter = shard.inter_count  # this rank's columns of the intermediate size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * self.inter, bias=False)
        self.down_proj = nn.Linear(self.inter, cfg.hidden_size, bias=False)
        self.reduce = reduce
        self.use_cpu_kernel = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        if T <= self.ROWS:
            out = self._rows(x)
        else:
            out = torch.cat([self._rows(x[r0:r0 + self.ROWS]) for r0 in range(0, T, self.ROWS)])
        return out if self.reduce is None else self.reduce(out)

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [t, 2I]
        if self.use_cpu_kernel:
            return self.down_proj(cpu_ops.silu_mul(gate_up))
        gate, up = gate_up.split(self.inter, dim=-1)  # [t, I] each
        return self.down_proj(F.silu(gate) * up)
