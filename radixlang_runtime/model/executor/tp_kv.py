"""TPRecordPort: KVRecordPort's records (mem/kv_records.py) over the K/V of every tensor-parallel rank, for PD.

Under tensor parallelism each rank's pool holds only its KV heads ([2, layers, kv_count, slots, head_dim],
parallel.Shard). The records PD moves are the whole model's, [2, layers, num_kv_heads, t, head_dim]: the
same bytes a tp_size 1 pool gives for the same K/V, so a prefill and a decode of any tp sizes exchange them
(the handshake's token_bytes still checks model and dtype). Rank 0 (the scheduler) does both sides:
- read: it broadcasts KVRead(slots); every rank index_selects its heads (padded to kv_count_max, so all
  ranks send equal shapes), rank 0 gathers them over the CPU group and places each rank's heads at its
  kv_start (a KV head replicated on several ranks is written once per replica, the same values);
- write: it broadcasts KVWrite(slots, payload) (the whole records); every rank keeps its heads' slice.
Per-layer entry shapes (Gemma 4: cfg.kv_head_map) go layer by layer instead (LayerHeads): a record is a tp_size 1
pool's (one part per group of its shapes); each rank sends its layers' heads as one byte vector (padded to the
largest rank's), and rank 0 places each pool head at the layer's KV head it holds (cfg.kv_head_map); a write
gives each rank those heads of each layer.
The workers (tp_worker.py) run `serve` on these between steps. Ordering is the group's one invariant
(parallel.py): rank 0 issues them on its scheduler thread between steps, so a read sees every earlier
step's K/V on every rank, and a write lands before any later step reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from radixlang_runtime.mem.kv_pool import KVShape, shape_groups
from radixlang_runtime.mem.kv_records import (check_joined, check_records, group_views, pack_joined, pack_records,
                                              unpack_records)
from radixlang_runtime.model.executor.parallel import head_split


@dataclass
class KVRead:
    """Rank 0 -> all: send the K/V heads of these slots (n * t of them) to rank 0 (TPGroup.gather_cpu)."""

    slots: list[int]


@dataclass
class KVWrite:
    """Rank 0 -> all: write these slots from `payload` (n whole records joined); each rank its own heads."""

    slots: list[int]
    payload: bytes
    n: int  # records


def _local_heads(runner: Any, slots: list[int]) -> torch.Tensor:
    """This rank's heads of `slots`: [2, layers, kv_count_max, len(slots), head_dim] on the CPU, as bytes
    (uint8, last dim head_dim * element size: gloo gathers any dtype so); heads past kv_count are zero."""
    block = runner.kv_pool.block
    kv = block.index_select(3, torch.tensor(slots, dtype=torch.int64, device=block.device)).cpu()
    pad = runner.shard.kv_count_max - kv.shape[2]
    if pad:
        kv = torch.cat([kv, kv.new_zeros(kv.shape[0], kv.shape[1], pad, *kv.shape[3:])], dim=2)
    return kv.contiguous().view(torch.uint8)


def _write_local(runner: Any, op: KVWrite, shape: tuple[int, ...]) -> None:
    block, sh = runner.kv_pool.block, runner.shard
    full = unpack_records(op.payload, op.n, shape, block.dtype)  # [2, L, H, n * t, D]
    mine = full[:, :, sh.kv_start:sh.kv_start + sh.kv_count].to(block.device)
    block.index_copy_(3, torch.tensor(op.slots, dtype=torch.int64, device=block.device), mine)


def record_shape(runner: Any, t: int) -> tuple[int, ...]:
    """One whole-model record: [2, layers, num_kv_heads, t, head_dim]."""
    cfg = runner.cfg
    return 2, cfg.num_hidden_layers, cfg.num_key_value_heads, t, cfg.head_dim


class LayerHeads:
    """Records of a model whose pool layers differ in shape (cfg.kv_head_map not None), layer by layer."""

    def __init__(self, cfg: Any, size: int, dtype: torch.dtype):
        full = [KVShape(*s) for s in cfg.kv_shapes(0, cfg.num_key_value_heads)]  # a tp_size 1 pool's layers
        self.groups = shape_groups(full)
        self.place = {i: (g, j) for g, (_, ls) in enumerate(self.groups) for j, i in enumerate(ls)}
        self.dims = [s.head_dim for s in full]
        self.maps = [cfg.kv_head_map(*head_split(cfg.num_attention_heads, cfg.num_key_value_heads, size, r)[2:])
                     for r in range(size)]  # per rank, per layer: the layer's KV head of each pool head
        self.dtype, self.elem = dtype, torch.empty((), dtype=dtype).element_size()

    def shapes(self, t: int) -> list[tuple[int, ...]]:
        """One record's parts, per group: [2, group layers, kv_heads, t, head_dim]."""
        return [(2, len(ls), s.kv_heads, t, s.head_dim) for s, ls in self.groups]

    def rank_bytes(self, rank: int, n: int) -> int:
        return sum(2 * len(h) * n * d for h, d in zip(self.maps[rank], self.dims)) * self.elem

    def local(self, runner: Any, slots: list[int]) -> torch.Tensor:
        """This rank's heads of every layer at slots, one uint8 vector padded to the largest rank's."""
        pool = runner.kv_pool
        idx = torch.tensor(slots, dtype=torch.int64, device=pool.device)
        parts = [torch.stack([pool.k_buffers[i].index_select(1, idx), pool.v_buffers[i].index_select(1, idx)])
                 .reshape(-1) for i in range(len(self.dims))]
        flat = torch.cat(parts).cpu().view(torch.uint8)
        pad = max(self.rank_bytes(r, len(slots)) for r in range(len(self.maps))) - flat.numel()
        return torch.cat([flat, flat.new_zeros(pad)]) if pad else flat

    def assemble(self, parts: list[torch.Tensor], n: int) -> list[torch.Tensor]:
        """Every rank's local() -> per group [2, group layers, kv_heads, n, head_dim] (the tp_size 1 layout)."""
        full = [torch.empty(2, len(ls), s.kv_heads, n, s.head_dim, dtype=self.dtype) for s, ls in self.groups]
        for rank, part in enumerate(parts):
            vals, off = part[:self.rank_bytes(rank, n)].view(self.dtype), 0
            for i, heads in enumerate(self.maps[rank]):
                count = 2 * len(heads) * n * self.dims[i]
                g, j = self.place[i]
                full[g][:, j, list(heads)] = vals[off:off + count].view(2, len(heads), n, self.dims[i])
                off += count
        return full

    def write(self, runner: Any, op: "KVWrite") -> None:
        """This rank's heads of each layer from op's whole records."""
        pool = runner.kv_pool
        t = len(op.slots) // op.n
        views = group_views(op.payload, op.n, self.shapes(t), self.dtype)  # per group [n, 2, L, H, t, D]
        idx = torch.tensor(op.slots, dtype=torch.int64, device=pool.device)
        for i, heads in enumerate(self.maps[runner.shard.rank]):
            g, j = self.place[i]
            kv = views[g][:, :, j][:, :, list(heads)]  # [n, 2, h, t, D]
            kv = kv.permute(1, 2, 0, 3, 4).reshape(2, len(heads), op.n * t, self.dims[i]).to(pool.device)
            pool.k_buffers[i].index_copy_(1, idx, kv[0])
            pool.v_buffers[i].index_copy_(1, idx, kv[1])


def layer_heads(runner: Any) -> Optional[LayerHeads]:
    """The per-layer records' layout where the model's pool layers differ in shape; None: one block's."""
    cfg = runner.cfg
    if cfg.kv_head_map(runner.shard.kv_start, runner.shard.kv_count) is None:
        return None
    return LayerHeads(cfg, runner.shard.size, runner.kv_pool.dtype)


@torch.inference_mode()
def serve(runner: Any, op: Any) -> None:
    """A worker rank (> 0): its part of rank 0's KVRead / KVWrite (the records are one token each, as PD's)."""
    layers = layer_heads(runner)
    if isinstance(op, KVRead):
        runner.tp.gather_cpu(_local_heads(runner, op.slots) if layers is None else layers.local(runner, op.slots))
    elif layers is not None:
        layers.write(runner, op)
    else:
        _write_local(runner, op, record_shape(runner, len(op.slots) // op.n))


class TPRecordPort:
    """KVRecordPort's interface (record_bytes, read_/write_records, read_/write_joined) on rank 0 of a TP group."""

    def __init__(self, runner: Any, record_tokens: int):
        if runner.cfg.mla is not None:  # every rank holds the whole latent entry: not a split of heads
            raise ValueError(f"PD disaggregation with tp_size {runner.tp.size} is not implemented for "
                             f"{runner.cfg.architecture} (multi-head latent attention): serve it with tp_size 1")
        self.runner, self.t, self.tp = runner, record_tokens, runner.tp
        self.shape = record_shape(runner, record_tokens)
        self.dtype = runner.kv_pool.dtype
        self.layers = layer_heads(runner)
        if self.layers is not None:  # per-layer shapes: a tp_size 1 pool's records, a part per group
            parts = self.layers.shapes(record_tokens)
            self.shape = parts[0]
            self.record_bytes = sum(math.prod(p) for p in parts) * self.layers.elem
        else:
            self.record_bytes = math.prod(self.shape) * runner.kv_pool.block.element_size()
        cfg = runner.cfg
        # (kv_start, kv_count) of every rank, in rank order
        self.heads = [head_split(cfg.num_attention_heads, cfg.num_key_value_heads, self.tp.size, r)[2:]
                      for r in range(self.tp.size)]

    def _gather(self, slots: list[int]) -> Union[torch.Tensor, list[torch.Tensor]]:
        """Every rank's heads of `slots` -> [2, layers, num_kv_heads, len(slots), head_dim] on the CPU (per-layer
        shapes: a part per group)."""
        self.tp.broadcast_obj(KVRead(slots))
        if self.layers is not None:
            return self.layers.assemble(self.tp.gather_cpu(self.layers.local(self.runner, slots)), len(slots))
        parts = self.tp.gather_cpu(_local_heads(self.runner, slots))
        two, layers, heads, _, dim = self.shape
        full = torch.empty(two, layers, heads, len(slots), dim, dtype=self.dtype)
        for (start, count), part in zip(self.heads, parts):
            full[:, :, start:start + count] = part.view(self.dtype)[:, :, :count]
        return full

    @torch.inference_mode()
    def read_records(self, slots: list[int]) -> list[bytes]:
        """slots: n * record_tokens slots -> n payloads of every rank's heads."""
        return pack_records(self._gather(list(slots)), self.t)

    @torch.inference_mode()
    def read_joined(self, slots: list[int]) -> bytes:
        return pack_joined(self._gather(list(slots)), self.t)

    def write_records(self, slots: list[int], payloads: list[bytes]) -> None:
        check_records(slots, payloads, self.t, self.record_bytes)
        self.write_joined(slots, b"".join(payloads))

    @torch.inference_mode()
    def write_joined(self, slots: list[int], data: bytes) -> None:
        """Refused on rank 0 (ValueError) before anything is broadcast when data is not whole records."""
        data = bytes(data)  # a received chunk's memoryview (disagg/link.py) is not picklable for the broadcast
        op = KVWrite(list(slots), data, check_joined(slots, data, self.t, self.record_bytes))
        self.tp.broadcast_obj(op)
        if self.layers is not None:
            self.layers.write(self.runner, op)
        else:
            _write_local(self.runner, op, self.shape)
