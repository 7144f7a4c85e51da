"""The LoRA deltas of one LoraLinear (model/layers/lora_linear.py) through the C segment kernel (kernels/csrc/cpu/
lora_sgmv.c, called through radixlang_kernels.cpu_ops): on CPU in float32 or bf16, one shrink call (x @ A^T for every
adapter's rows, the A of all its sub-projections stacked) and one expand call (each sub-projection's slice
+= t @ (B * scaling)^T) per linear, where the torch path makes two matmuls per adapter and sub-projection.

The step's rows are listed adapter by adapter once (LoraSegments); each linear keeps its weights as the kernel
reads them (SgmvWeights) and the per-adapter-set call arguments cached. The kernel runs when every adapter of the
step has deltas on this linear and the step's adapter rows are at most SGMV_MAX_ROWS of the dtype (where it
measured faster than the torch path, docs/LORA.md#kernel); otherwise the torch path runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from radixlang_kernels import cpu_ops
from radixlang_kernels.op_table import pointer_array

# the most adapter rows of a step the kernel takes, per dtype (docs/LORA.md#kernel): float32 measured faster
# than the torch path at every size from 1 to 1024 rows; bf16 up to 64 rows, mixed at 256 and above
SGMV_MAX_ROWS = {torch.float32: 1024, torch.bfloat16: 64}
KERNEL_DTYPES = tuple(SGMV_MAX_ROWS)


def lora_sgmv_ready() -> bool:
    return cpu_ops.load() is not None


@dataclass
class LoraSegments:
    lora_ids: tuple[int, ...]  # the adapters in segment order
    rows: torch.Tensor  # [R] int64 row of each position, adapter by adapter
    seg_starts: torch.Tensor  # [S + 1] int64

    @classmethod
    def build(cls, rows: dict[int, list[int]], device: Optional[torch.device] = None,
              bounded: bool = True) -> Optional["LoraSegments"]:
        """None without rows or (bounded: the C kernel's) past SGMV_MAX_ROWS; the tensors on device (default CPU)."""
        flat = [r for rs in rows.values() for r in rs]
        if not flat or (bounded and len(flat) > max(SGMV_MAX_ROWS.values())):
            return None
        starts = [0]
        for rs in rows.values():
            starts.append(starts[-1] + len(rs))
        return cls(tuple(rows), torch.tensor(flat, dtype=torch.int64, device=device),
                   torch.tensor(starts, dtype=torch.int64, device=device))


@dataclass
class _Calls:
    """The kernel's arguments for one set of adapters (in segment order)."""

    a_ptrs: Any
    ranks: torch.Tensor
    tasks: torch.Tensor
    b_ptrs: Any
    width: int  # t's row width: the largest stacked rank
    keep: list  # the tensors the pointers name


class SgmvWeights:
    def __init__(self) -> None:
        self.a: dict[int, torch.Tensor] = {}  # adapter -> stacked A [sum r, K] (the model's dtype)
        self.parts: dict[int, list[tuple[int, int, int, int, torch.Tensor]]] = {}  # -> (col, r, off, n, Bt [r, n])
        self._calls: dict[tuple[int, ...], _Calls] = {}

    def set(self, lora_id: int, deltas: list) -> None:
        """deltas: LoraLinear's (offset, size, A [r, K], B [size, r]) of the adapter."""
        self._calls.clear()
        if any(a.dtype not in KERNEL_DTYPES or a.device.type != "cpu" for _, _, a, _ in deltas):
            self.a.pop(lora_id, None)
            return
        self.a[lora_id] = torch.cat([a for _, _, a, _ in deltas]).contiguous()
        parts, col = [], 0
        for off, size, a, b in deltas:
            parts.append((col, a.shape[0], off, size, b.t().contiguous()))
            col += a.shape[0]
        self.parts[lora_id] = parts

    def drop(self, lora_id: int) -> None:
        self._calls.clear()
        self.a.pop(lora_id, None)
        self.parts.pop(lora_id, None)

    def run(self, x: torch.Tensor, y: torch.Tensor, seg: LoraSegments) -> bool:
        """y += every adapter's deltas for its rows; False (nothing done) where the kernel does not apply."""
        if (x.dtype not in KERNEL_DTYPES or seg.rows.shape[0] > SGMV_MAX_ROWS[x.dtype] or x.dim() != 2
                or x.stride(1) != 1 or not y.is_contiguous()):
            return False
        calls = self._calls.get(seg.lora_ids)
        if calls is None:
            if any(lid not in self.a or self.a[lid].dtype != x.dtype for lid in seg.lora_ids):
                return False
            calls = self._calls[seg.lora_ids] = self._build(seg.lora_ids)
        t = torch.empty(seg.rows.shape[0], calls.width, dtype=torch.float32)
        cpu_ops.lora_shrink(x, seg.rows, seg.seg_starts, calls.a_ptrs, calls.ranks, t)
        cpu_ops.lora_expand(t, seg.rows, seg.seg_starts, calls.tasks, calls.b_ptrs, y)
        return True

    def _build(self, lora_ids: tuple[int, ...]) -> _Calls:
        a = [self.a[lid] for lid in lora_ids]
        tasks, bts = [], []
        for s, lid in enumerate(lora_ids):
            for col, r, off, n, bt in self.parts[lid]:
                tasks.append([s, col, r, off, n])
                bts.append(bt)
        ranks = torch.tensor([t.shape[0] for t in a], dtype=torch.int64)
        return _Calls(pointer_array([t.data_ptr() for t in a]), ranks, torch.tensor(tasks, dtype=torch.int64),
                      pointer_array([t.data_ptr() for t in bts]), int(ranks.max()), [a, bts])
