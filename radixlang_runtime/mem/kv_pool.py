"""KV pool: per layer a K and a V buffer indexed by token slot, and the `req_to_token` table.

Layout: head-major, [kv_heads, num_slots, head_dim]. Gathering a batch's slots along dim 1 then
yields [kv_heads, B, L, head_dim] directly, the layout batched matmul wants (no transpose copy);
on CPU that halves decode attention time against the token-major [num_slots, kv_heads, head_dim].

Entry shapes per layer (`shapes`: (kv_heads, head_dim) of each layer; Gemma 4's sliding and global layers
differ): the layers of one shape form a group, whose K/V live in one block [2, group layers, kv_heads,
num_slots, head_dim]; k_buffers[l] / v_buffers[l] are views of layer l's group block at its own shape (no
layer is padded to another's). A model with one shape (every family but Gemma 4) has one group, and
`block` is it. All groups' blocks are carved from one allocation (mem/kv_memory.py), group after group.
A token's bytes are the sum over layers of 2 x kv_heads x head_dim x the dtype's size (bytes_per_token).

Latent layout (v_view set: multi-head latent attention, model/layers/mla_spec.py): a token's entry is one
buffer per layer, [kv_heads, num_slots, head_dim], and V is a view of its first v_view lanes (no second
copy): the block is [1, layers, kv_heads, num_slots, head_dim]. Whatever moves slots (the allocator, the
radix cache, retraction, kv_records for the hierarchical tiers and PD) moves every group block's dim 3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

import torch

from radixlang_runtime.mem.kv_memory import kv_block, lazy_pages
from radixlang_runtime.mem.kv_prefault import KVPrefaulter


class KVShape(NamedTuple):
    """One layer's entry per token: kv_heads heads of head_dim lanes (K and V each)."""

    kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class KVGroup:
    """The layers of one entry shape and their block [2 (1 latent), len(layers), kv_heads, num_slots, head_dim]."""

    layers: tuple[int, ...]  # pool layers, ascending
    block: torch.Tensor


def layer_shapes(num_layers: int, kv_heads: int, head_dim: int,
                 shapes: Optional[Sequence[tuple[int, int]]]) -> list[KVShape]:
    """Each layer's KVShape: `shapes` (one per layer) where given, else every layer (kv_heads, head_dim)."""
    if shapes is None:
        return [KVShape(kv_heads, head_dim)] * num_layers
    if len(shapes) != num_layers:
        raise ValueError(f"KV pool: {len(shapes)} entry shapes for {num_layers} layers")
    return [KVShape(int(h), int(d)) for h, d in shapes]


def shape_groups(shapes: Sequence[KVShape]) -> list[tuple[KVShape, tuple[int, ...]]]:
    """(shape, its layers) for each distinct shape, in order of its first layer."""
    groups: dict[KVShape, list[int]] = {}
    for i, s in enumerate(shapes):
        groups.setdefault(s, []).append(i)
    return [(s, tuple(ls)) for s, ls in groups.items()]


class KVPool:
    def __init__(self, num_slots: int, num_layers: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, table_rows: int, context_len: int,
                 v_view: Optional[int] = None, shapes: Optional[Sequence[tuple[int, int]]] = None):
        """shapes: (kv_heads, head_dim) of each layer where layers differ (then kv_heads / head_dim are unused)."""
        self.num_slots = num_slots
        self.v_view = v_view  # the latent layout's V width (module docstring); None: separate K and V
        two = 1 if v_view else 2
        self.shapes = layer_shapes(num_layers, kv_heads, head_dim, shapes)
        plan = [((two, len(ls), s.kv_heads, num_slots, s.head_dim), ls) for s, ls in shape_groups(self.shapes)]
        sizes = [math.prod(shape) for shape, _ in plan]
        # One allocation for every group, lazily zero when large (mem/kv_memory.py); one group: exactly its block
        flat = kv_block((sum(sizes),), dtype, device)
        self.groups: list[KVGroup] = []
        off = 0
        for (shape, ls), n in zip(plan, sizes):
            self.groups.append(KVGroup(ls, flat[off:off + n].view(shape)))
            off += n
        self.nbytes = flat.numel() * flat.element_size()
        self.lazy = lazy_pages(self.nbytes, device)  # pages resident once written: a prefaulter may run ahead
        self.prefaulter: Optional[KVPrefaulter] = None  # set by whoever knows the allocator (wiring.py)
        # k_buffers[l] = its group block[0, j], v_buffers[l] = block[1, j]: [kv_heads, num_slots, head_dim], contiguous
        self.k_buffers: list[torch.Tensor] = [None] * num_layers  # type: ignore[list-item]
        self.v_buffers: list[torch.Tensor] = [None] * num_layers  # type: ignore[list-item]
        for g in self.groups:
            for j, i in enumerate(g.layers):
                self.k_buffers[i] = g.block[0, j]
                self.v_buffers[i] = g.block[0, j, ..., :v_view] if v_view else g.block[1, j]
        self.head_counts = sorted({s.kv_heads for s in self.shapes})  # flat_index's distinct head counts
        # req_to_token[row, pos] = slot of position pos of the request in that row. [table_rows, context_len] int64.
        # Entries past a request's length are stale but always valid slot numbers (gathers stay in range).
        self.req_to_token = torch.zeros(table_rows, context_len, dtype=torch.int64, device=device)

    @property
    def block(self) -> torch.Tensor:
        """The one block of a pool whose layers share an entry shape; a pool of several groups has no one block."""
        if len(self.groups) != 1:
            raise ValueError(f"the KV pool holds {len(self.groups)} entry shapes (per-layer KV shapes): read "
                             "its groups, not one block")
        return self.groups[0].block

    @property
    def dtype(self) -> torch.dtype:
        return self.groups[0].block.dtype

    @property
    def device(self) -> torch.device:
        return self.groups[0].block.device

    @staticmethod
    def bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                        v_view: Optional[int] = None, shapes: Optional[Sequence[tuple[int, int]]] = None) -> int:
        """A token's bytes over every layer: sum of (2, latent 1) x kv_heads x head_dim x the dtype's size."""
        size = torch.empty((), dtype=dtype).element_size()
        lanes = sum(h * d for h, d in layer_shapes(num_layers, kv_heads, head_dim, shapes))
        return (1 if v_view else 2) * lanes * size

    def store(self, layer: int, out_loc: torch.Tensor, k: torch.Tensor, v: Optional[torch.Tensor]) -> None:
        """out_loc: [T] slots; k, v: [T, kv_heads, head_dim] (latent layout: k is the whole entry, v None)."""
        self.k_buffers[layer].index_copy_(1, out_loc, k.transpose(0, 1))
        if self.v_view:
            return
        self.v_buffers[layer].index_copy_(1, out_loc, v.transpose(0, 1))

    def flat_index(self, slots: torch.Tensor, kv_heads: Optional[int] = None) -> torch.Tensor:
        """slots [N] -> rows [kv_heads * N] of a buffer viewed as [kv_heads * num_slots, head_dim]
        (kv_heads: the layers' it is for; default layer 0's)."""
        heads = torch.arange(kv_heads or self.k_buffers[0].shape[0], device=slots.device)
        return (heads[:, None] * self.num_slots + slots[None, :]).reshape(-1)

    def flat_rows(self, slots: torch.Tensor) -> dict[int, torch.Tensor]:
        """flat_index(slots, h) for each head count h some layer has."""
        return {h: self.flat_index(slots, h) for h in self.head_counts}

    def gather(self, layer: int, flat_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """flat_rows from flat_index(slots, the layer's kv_heads) -> K, V each [kv_heads, N, head_dim], contiguous.

        A row gather over the 2-D view runs on all intra-op threads (a gather along dim 1 of the
        3-D buffer does not), which matters: decode reads every cached token of every layer.
        """
        hkv, _, d = self.k_buffers[layer].shape
        k = self.k_buffers[layer].view(-1, d).index_select(0, flat_rows)
        if self.v_view:
            k = k.view(hkv, -1, d)
            return k, k[..., : self.v_view]
        v = self.v_buffers[layer].view(-1, d).index_select(0, flat_rows)
        return k.view(hkv, -1, d), v.view(hkv, -1, d)
