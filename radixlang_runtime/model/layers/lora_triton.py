"""The LoRA deltas of one LoraLinear (model/layers/lora_linear.py) through the Triton segment kernels
(kernels/radixlang_kernels/lora_sgmv.py, SGLang's `--lora-backend triton`): one shrink and one expand launch per
linear for every adapter of the step, on any device Triton runs on (CUDA; on CPU only interpreted,
TRITON_INTERPRET=1, which is how the tests run it).

The kernels read the adapters stacked in buffers, one slot per adapter of the step (SGLang's layout): per
adapter, A of all its sub-projections stacked ([sum r, K]: q, k, v of qkv_proj; gate, up of gate_up_proj) and
B * scaling placed block-diagonally in the linear's whole output width ([N, sum r]: sub-projection p's B at
its output slice and its columns of the stacked rank, zeros elsewhere), so one expand adds every
sub-projection's delta to its own slice. An adapter without deltas on this linear gets rank 0 (the kernels
add nothing for its rows). The buffers of a set of adapters are built once and kept (MAX_SETS sets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlang_runtime.model.layers.lora_sgmv import LoraSegments

MAX_SETS = 16  # adapter sets (in segment order) whose stacked buffers a linear keeps


def triton_lora_ready(device: torch.device) -> str:
    """Why `--lora-backend triton` cannot run on device ("" when it can)."""
    import os

    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "lora_backend triton runs on CUDA devices (on CPU only interpreted, with TRITON_INTERPRET=1)"
    try:
        import radixlang_kernels.lora_sgmv  # noqa: F401
    except ImportError as e:
        return f"lora_backend triton needs Triton ({e})"
    return ""


@dataclass
class _Buffers:
    a: torch.Tensor  # [L, R, K]
    b: torch.Tensor  # [L, N, R]
    ranks: torch.Tensor  # [L] int64
    slots: torch.Tensor  # [L] int64: segment s -> slot s


class TritonLoraWeights:
    def __init__(self) -> None:
        self.deltas: dict[int, list] = {}  # adapter -> LoraLinear's (offset, size, A [r, K], B [size, r])
        self._sets: dict[tuple, _Buffers] = {}

    def set(self, lora_id: int, deltas: list) -> None:
        self._sets.clear()
        self.deltas[lora_id] = deltas

    def drop(self, lora_id: int) -> None:
        self._sets.clear()
        self.deltas.pop(lora_id, None)

    def run(self, x: torch.Tensor, y: torch.Tensor, seg: LoraSegments) -> bool:
        """y += every adapter's deltas for its rows; False (nothing done) where the kernels do not apply."""
        from radixlang_kernels.lora_sgmv import sgmv_expand, sgmv_shrink

        if x.dim() != 2 or x.stride(1) != 1 or y.dim() != 2 or y.stride(1) != 1:
            return False
        if not any(self.deltas.get(lid) for lid in seg.lora_ids):
            return True  # no adapter of the step targets this linear
        key = (seg.lora_ids, x.dtype, x.device, y.shape[1])
        bufs = self._sets.get(key)
        if bufs is None:
            if len(self._sets) >= MAX_SETS:
                self._sets.clear()
            bufs = self._sets[key] = self._build(seg.lora_ids, x.dtype, x.device, x.shape[1], y.shape[1])
        t = sgmv_shrink(x, bufs.a, seg.rows, seg.seg_starts, bufs.slots, bufs.ranks)
        sgmv_expand(t, bufs.b, seg.rows, seg.seg_starts, bufs.slots, bufs.ranks, y)
        return True

    def _build(self, lora_ids: tuple, dtype: torch.dtype, device: torch.device, k: int, n: int) -> _Buffers:
        stacked = [sum(a.shape[0] for _, _, a, _ in self.deltas.get(lid, [])) for lid in lora_ids]
        r = max(1, max(stacked))
        a_buf = torch.zeros(len(lora_ids), r, k, dtype=dtype, device=device)
        b_buf = torch.zeros(len(lora_ids), n, r, dtype=dtype, device=device)
        for s, lid in enumerate(lora_ids):
            col = 0
            for off, size, a, b in self.deltas.get(lid, []):
                rank = a.shape[0]
                a_buf[s, col:col + rank] = a.to(dtype)
                b_buf[s, off:off + size, col:col + rank] = b.to(dtype)
                col += rank
        ranks = torch.tensor(stacked, dtype=torch.int64, device=device)
        return _Buffers(a_buf, b_buf, ranks, torch.arange(len(lora_ids), dtype=torch.int64, device=device))
