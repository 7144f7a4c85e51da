"""LoRA on the served model's projections: each fused linear (qkv_proj, o_proj, gate_up_proj, down_proj) wrapped
once in a LoraLinear, which adds every adapter's delta to its own output slice (q, k, v of qkv_proj; gate, up
of gate_up_proj), for the rows of the requests using that adapter:

    y[rows_i, slice_p] += (x[rows_i] @ A_ip^T) @ (B_ip * scaling_i)^T

Rows are grouped per adapter once per step (LoraState.set_rows): a contiguous run of rows is a slice, else an
index gather / scatter. The math is torch (any device), or on CPU (float32, bf16) the C segment kernel
(model/layers/lora_sgmv.py: one shrink and one expand call per linear for every adapter of the step), or with
--lora-backend triton the Triton segment kernels (model/layers/lora_triton.py, the same two calls). A step whose
requests all run the base model sets no groups: each wrapper then calls the base linear and returns (the fused
decode layer, model/executor/fused_decode.py, runs as without LoRA).
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from radixlang_runtime.model.loader.lora_adapter import LoraAdapter
from radixlang_runtime.model.layers.lora_sgmv import LoraSegments, SgmvWeights, lora_sgmv_ready
from radixlang_runtime.model.layers.lora_triton import TritonLoraWeights
from radixlang_runtime.model.layers.lora_tp import shard_lora

Rows = Union[slice, torch.Tensor]


class LoraState:
    """The current step's row groups, shared by every LoraLinear of the model."""

    def __init__(self, use_kernel: bool = True, backend: str = "csgmv") -> None:
        self.use_kernel = use_kernel  # --lora-backend csgmv: the C kernel where it may run; torch_native: never
        self.backend = backend  # triton: the Triton segment kernels (model/layers/lora_triton.py) on every step
        self.groups: list[tuple[int, Rows]] = []  # (adapter id, rows of the flattened tokens)
        self.segments: Optional[LoraSegments] = None  # the same groups for the C kernel (set where it may run)

    def set_rows(self, lora_ids: list[int], counts: list[int], device: torch.device) -> None:
        """lora_ids / counts per request (0: the base model); rows are the requests' tokens in order."""
        rows: dict[int, list[int]] = {}
        start = 0
        for lid, n in zip(lora_ids, counts):
            if lid:
                rows.setdefault(lid, []).extend(range(start, start + n))
            start += n
        self.groups = []
        for lid, r in rows.items():
            contiguous = r[-1] - r[0] + 1 == len(r)
            self.groups.append((lid, slice(r[0], r[-1] + 1) if contiguous
                                else torch.tensor(r, dtype=torch.int64, device=device)))
        if self.backend == "triton":
            self.segments = LoraSegments.build(rows, device, bounded=False)
        else:
            self.segments = LoraSegments.build(rows) if (self.use_kernel and device.type == "cpu"
                                                              and lora_sgmv_ready()) else None

    def clear(self) -> None:
        self.groups = []
        self.segments = None


class LoraLinear(nn.Module):
    """A base linear plus per-adapter deltas on output slices `parts` (name -> (offset, size))."""

    def __init__(self, base: nn.Module, parts: dict[str, tuple[int, int]], state: LoraState):
        super().__init__()
        self.base = base
        self.parts = parts
        self.state = state
        # adapter id -> [(offset, size, A [r, in], B [size, r])]; B is a view of B^T [r, size] (contiguous)
        self.deltas: dict[int, list[tuple[int, int, torch.Tensor, torch.Tensor]]] = {}
        # the same weights as the kernels read them (model/layers/lora_sgmv.py: C; lora_triton.py: Triton)
        self.kernel = TritonLoraWeights() if state.backend == "triton" else SgmvWeights()

    def add(self, lora_id: int, part: str, a: torch.Tensor, b: torch.Tensor) -> None:
        off, size = self.parts[part]
        if b.shape[0] != size:
            raise ValueError(f"LoRA {part}: B has {b.shape[0]} rows, the projection {size}")
        self.deltas.setdefault(lora_id, []).append((off, size, a, b.t().contiguous().t()))
        self.kernel.set(lora_id, self.deltas[lora_id])

    def drop(self, lora_id: int) -> None:
        self.deltas.pop(lora_id, None)
        self.kernel.drop(lora_id)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        seg = self.state.segments
        if seg is not None and self.kernel.run(x, y, seg):
            return y
        for lid, rows in self.state.groups:
            deltas = self.deltas.get(lid)
            if not deltas:
                continue
            xs = x[rows]
            for off, size, a, b in deltas:
                if isinstance(rows, slice):
                    y[rows, off:off + size].addmm_(xs @ a.t(), b.t())
                else:
                    y[rows, off:off + size] += (xs @ a.t()) @ b.t()
        return y


_WRAPPED = {  # projection -> (module path in a layer, the fused linear's attribute)
    "q_proj": ("self_attn", "qkv_proj"), "k_proj": ("self_attn", "qkv_proj"), "v_proj": ("self_attn", "qkv_proj"),
    "o_proj": ("self_attn", "o_proj"), "gate_proj": ("mlp", "gate_up_proj"), "up_proj": ("mlp", "gate_up_proj"),
    "down_proj": ("mlp", "down_proj"),
}


def _parts(layer: nn.Module, owner: str, attr: str) -> Optional[dict[str, tuple[int, int]]]:
    if owner == "self_attn":
        a = layer.self_attn
        if attr == "qkv_proj":
            return {"q_proj": (0, a.q_size), "k_proj": (a.q_size, a.kv_size), "v_proj": (a.q_size + a.kv_size,
                                                                                         a.kv_size)}
        return {"o_proj": (0, a.o_proj.out_features)}
    mlp = layer.mlp
    if not hasattr(mlp, "gate_up_proj") or not hasattr(mlp, "inter"):
        return None  # a mixture-of-experts block
    if attr == "gate_up_proj":
        return {"gate_proj": (0, mlp.inter), "up_proj": (mlp.inter, mlp.inter)}
    return {"down_proj": (0, mlp.down_proj.out_features)}


class LoraModel:
    """The model's LoraLinears and the adapters loaded into them."""

    def __init__(self, model: nn.Module, use_kernel: bool = True, backend: str = "csgmv"):
        if getattr(model, "lora_refusal", None):  # a family whose projections LoRA cannot address
            raise ValueError(model.lora_refusal)
        self.model = model
        self.state = LoraState(use_kernel, backend)
        self.adapters: dict[int, LoraAdapter] = {}
        for layer in model.layers:
            for owner, attr in dict.fromkeys(_WRAPPED.values()):
                parts = _parts(layer, owner, attr)
                if parts is None:
                    continue
                mod = getattr(layer, owner)
                setattr(mod, attr, LoraLinear(getattr(mod, attr), parts, self.state))
        self._blocked = [layer.mlp for layer in model.layers if hasattr(layer.mlp, "ROWS")]

    def begin(self, lora_ids: list[int], counts: list[int], device: torch.device) -> None:
        """A step with adapters: its row groups; the MLPs run the step's rows as one block (the groups index the
        whole step), restored by `end`."""
        if missing := sorted({i for i in lora_ids if i and i not in self.adapters}):
            raise RuntimeError(f"LoRA adapter id(s) {missing} are not resident for this step")
        self.state.set_rows(lora_ids, counts, device)
        for mlp in self._blocked:
            mlp.ROWS = 1 << 62

    def end(self) -> None:
        self.state.clear()
        for mlp in self._blocked:
            del mlp.ROWS  # the class's row block again

    def load(self, adapter: LoraAdapter) -> None:
        """The adapter's deltas into the LoraLinears (with tensor parallelism, this rank's part: lora_tp.py)."""
        shard = getattr(self.model, "shard", None)
        for (i, proj), (a, b) in adapter.weights.items():
            if shard is not None and shard.size > 1:
                a, b = shard_lora(proj, a, b, shard, self.model.cfg.head_dim)
            owner, attr = _WRAPPED[proj]
            lin = getattr(getattr(self.model.layers[i], owner), attr)
            if not isinstance(lin, LoraLinear):
                raise ValueError(f"LoRA adapter {adapter.name!r}: target {proj} is not a dense projection of "
                                 f"this model (layer {i})")
            lin.add(adapter.lora_id, proj, a, b)
        self.adapters[adapter.lora_id] = adapter

    def unload(self, lora_id: int) -> None:
        for m in self.model.modules():
            if isinstance(m, LoraLinear):
                m.drop(lora_id)
        self.adapters.pop(lora_id, None)
