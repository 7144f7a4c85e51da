"""KVRecordPort: K/V of token slots <-> record payload bytes, for the tiers (mem/hicache.py) and PD (disagg/).

A record's payload is its K and V for all layers, [2, layers, kv_heads, record_tokens, head_dim] in
the pool's dtype, contiguous, as raw bytes (the pool is [2, layers, kv_heads, num_slots, head_dim]:
one index_select over the slot dimension reads a batch of records, one index_copy_ writes them).
A pool of several entry shapes (mem/kv_pool.py's groups) has a record part per group, group after group,
each [2, group layers, kv_heads, record_tokens, head_dim] at its own shape: a record's bytes are the groups'
sum, and each group block is read and written as one block is.
n records joined are the n payloads one after the other: the tiers store records one by one
(read_records / write_records), PD moves a chunk of records as one message (read_joined /
write_joined: no per-record split or join, the bytes are copied once each way).
pack_* / unpack_records are that layout, the one serializer: model/executor/tp_kv.py builds the same records
from the K/V heads of every tensor-parallel rank.
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence, Union

import torch

from radixlang_runtime.mem.kv_pool import KVPool


Parts = Union[torch.Tensor, Sequence[torch.Tensor]]  # one block's slots, or each group block's


def _group_rows(kv: torch.Tensor, t: int) -> torch.Tensor:
    """kv [2, layers, heads, n * t, head_dim] (any device) -> [n, bytes] uint8 on the CPU, contiguous."""
    two, layers, heads, nt, dim = kv.shape
    n = nt // t
    kv = kv.reshape(two, layers, heads, n, t, dim).permute(3, 0, 1, 2, 4, 5).contiguous().cpu()
    return kv.view(n, -1).view(torch.uint8)


def _record_rows(kv: Parts, t: int) -> torch.Tensor:
    """kv: [2, layers, heads, n * t, head_dim], or one such part per group -> [n, record_bytes] uint8 (CPU)."""
    if isinstance(kv, torch.Tensor):
        return _group_rows(kv, t)
    rows = [_group_rows(part, t) for part in kv]
    return rows[0] if len(rows) == 1 else torch.cat(rows, dim=1)


def pack_records(kv: Parts, t: int) -> list[bytes]:
    """kv [2, layers, heads, n * t, head_dim] (or a part per group) -> n payloads of t tokens each."""
    raw = _record_rows(kv, t)
    return [bytes(raw[i].numpy()) for i in range(raw.shape[0])]


def pack_joined(kv: Parts, t: int) -> bytes:
    """kv [2, layers, heads, n * t, head_dim] (or a part per group) -> the n payloads joined
    (== b"".join(pack_records(kv, t)))."""
    return _record_rows(kv, t).numpy().tobytes()


def record_views(data: bytes, n: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """n payloads joined (data), each of `shape` [2, layers, heads, t, head_dim] -> [n, *shape], a read-only view
    of data itself (no copy): callers only read it (copy from it, slice it, move it)."""
    with warnings.catch_warnings():  # torch warns that bytes are not writable: nothing writes this view
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(data, dtype=torch.uint8)
    return flat.view(dtype).view(n, *shape)


def group_views(data: bytes, n: int, shapes: Sequence[tuple[int, ...]], dtype: torch.dtype) -> list[torch.Tensor]:
    """n payloads joined, each a part per group of `shapes` one after the other -> per group [n, *shape], read-only
    views of data (record_views' for one group)."""
    if len(shapes) == 1:
        return [record_views(data, n, shapes[0], dtype)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        rows = torch.frombuffer(data, dtype=torch.uint8).view(n, -1)  # [n, record_bytes]
    size = torch.empty((), dtype=dtype).element_size()
    out, off = [], 0
    for shape in shapes:
        nbytes = math.prod(shape) * size
        out.append(rows[:, off:off + nbytes].view(dtype).view(n, *shape))
        off += nbytes
    return out


def unpack_records(data: bytes, n: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """n payloads joined (data), each of `shape` [2, layers, heads, t, head_dim] -> [2, layers, heads, n * t,
    head_dim] on the CPU (a copy, except for n == 1: then a read-only view of data, as record_views)."""
    two, layers, heads, t, dim = shape
    kv = record_views(data, n, shape, dtype)
    return kv.permute(1, 2, 3, 0, 4, 5).reshape(two, layers, heads, n * t, dim)


def slot_runs(slots: list[int]) -> list[tuple[int, int, int]]:
    """slots -> (i, first slot, length) for each maximal run slots[i:i + length] == range(first, first + length)."""
    runs = []
    i = 0
    while i < len(slots):
        j = i + 1
        while j < len(slots) and slots[j] == slots[j - 1] + 1:
            j += 1
        runs.append((i, slots[i], j - i))
        i = j
    return runs


def check_records(slots: list[int], payloads: list[bytes], t: int, record_bytes: int) -> None:
    """write_records' precondition: n payloads of record_bytes each for n * t slots (else ValueError)."""
    n = len(payloads)
    if len(slots) != n * t or any(len(p) != record_bytes for p in payloads):
        raise ValueError(f"write_records: {len(slots)} slots for {n} records of {t} tokens, "
                         f"payloads of {record_bytes} bytes each")


def check_joined(slots: list[int], data: bytes, t: int, record_bytes: int) -> int:
    """write_joined's precondition: data is n whole records for n * t slots (else ValueError) -> n."""
    n, rest = divmod(len(data), record_bytes)
    if rest or len(slots) != n * t:
        raise ValueError(f"write_joined: {len(slots)} slots and {len(data)} bytes; records are {t} tokens of "
                         f"{record_bytes} bytes")
    return n


class KVRecordPort:
    def __init__(self, pool: KVPool, record_tokens: int):
        self.pool = pool
        self.t = record_tokens
        self.blocks = [g.block for g in pool.groups]
        # one record's part per group: [2, group layers, heads, t, head_dim]
        self.shapes = [(b.shape[0], b.shape[1], b.shape[2], record_tokens, b.shape[4]) for b in self.blocks]
        self.shape = self.shapes[0]  # a one-group pool's record
        self.dtype = pool.dtype
        self.record_bytes = sum(math.prod(s) for s in self.shapes) * self.blocks[0].element_size()

    def _select(self, slots: list[int]) -> list[torch.Tensor]:
        idx = torch.tensor(slots, dtype=torch.int64, device=self.pool.device)
        return [b.index_select(3, idx) for b in self.blocks]  # per group [2, L, H, n*T, D]

    def read_records(self, slots: list[int]) -> list[bytes]:
        """slots: n * record_tokens slots, record after record -> n payloads."""
        return pack_records(self._select(slots), self.t)

    def read_joined(self, slots: list[int]) -> bytes:
        """The same n payloads, joined."""
        return pack_joined(self._select(slots), self.t)

    def write_records(self, slots: list[int], payloads: list[bytes]) -> None:
        check_records(slots, payloads, self.t, self.record_bytes)
        if self.t == 1:
            self.write_joined(slots, b"".join(payloads))
            return
        views = [group_views(p, 1, self.shapes, self.dtype) for p in payloads]  # per payload, per group [1, ...]
        for g, block in enumerate(self.blocks):
            self._copy_in(block, slots, [v[g][0] for v in views])

    def write_joined(self, slots: list[int], data: bytes) -> None:
        """slots: n * record_tokens slots <- data, n payloads joined (a refused call leaves the pool as it was)."""
        n = check_joined(slots, data, self.t, self.record_bytes)
        views = group_views(data, n, self.shapes, self.dtype)  # per group [n, 2, L, H, t, D]
        for block, view in zip(self.blocks, views):
            if self.t == 1:
                self._write_tokens(block, slots, view.permute(1, 2, 3, 0, 4, 5).flatten(3, 4))
            else:
                self._copy_in(block, slots, list(view))

    @staticmethod
    def _write_tokens(block: torch.Tensor, slots: list[int], kv: torch.Tensor) -> None:
        """PD's one-token records: kv [2, L, H, n, D] (a view of the payload bytes) -> slots of block."""
        runs = slot_runs(slots) if block.device.type == "cpu" else []  # a device pool: index_copy_ only
        if runs and len(runs) * 4 <= len(slots):
            # a strided copy per run of consecutive slots (a page or more): faster than index_copy_,
            # which moves element by element (docs/PERFORMANCE.md, PD's one-token writes)
            for i, s, r in runs:
                block[:, :, :, s:s + r].copy_(kv[:, :, :, i:i + r])
            return
        block.index_copy_(3, torch.tensor(slots, dtype=torch.int64, device=block.device), kv.to(block.device))

    def _copy_in(self, block: torch.Tensor, slots: list[int], records: list[torch.Tensor]) -> None:
        """records[i] [2, layers, heads, t, head_dim] -> slots[i * t:(i + 1) * t] of block: straight from the
        payload bytes into the pool, one index_copy_ per record (a transposing copy of all records first costs
        ~7x for 32-token records: docs/PERFORMANCE.md)."""
        t = self.t
        idx = torch.tensor(slots, dtype=torch.int64, device=block.device)
        for i, kv in enumerate(records):
            block.index_copy_(3, idx[i * t:(i + 1) * t], kv.to(block.device))
