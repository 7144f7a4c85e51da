"""KVRecordPort: K/V of token slots <-> record payload bytes, for the tiers (mem/hicache.py) and PD (disagg/).

A record's payload is its K and V for all layers, [2, layers, kv_heads, record_tokens, head_dim] in
the pool's dtype, contiguous, as raw bytes (the pool is [2, layers, kv_heads, num_slots, head_dim]:
one index_select over the slot dimension reads a batch of records, one index_copy_ writes them).
n records joined are the n payloads one after the other: the tiers store records one by one
(read_records / write_records), PD moves a chunk of records as one message (read_joined /
write_joined: no per-record split or join, the bytes are copied once each way).
pack_* / unpack_records are that layout, the one serializer: model/executor/tp_kv.py builds the same records
from the K/V heads of every tensor-parallel rank.
"""

from __future__ import annotations

import warnings

import torch

from radixlang_runtime.mem.kv_pool import KVPool


def _record_rows(kv: torch.Tensor, t: int) -> torch.Tensor:
    """kv [2, layers, heads, n * t, head_dim] (any device) -> [n, record_bytes] uint8 on the CPU, contiguous."""
    two, layers, heads, nt, dim = kv.shape
    n = nt // t
    kv = kv.reshape(two, layers, heads, n, t, dim).permute(3, 0, 1, 2, 4, 5).contiguous().cpu()
    return kv.view(n, -1).view(torch.uint8)


def pack_records(kv: torch.Tensor, t: int) -> list[bytes]:
    """kv [2, layers, heads, n * t, head_dim] -> n payloads of t tokens each."""
    raw = _record_rows(kv, t)
    return [bytes(raw[i].numpy()) for i in range(raw.shape[0])]


def pack_joined(kv: torch.Tensor, t: int) -> bytes:
    """kv [2, layers, heads, n * t, head_dim] -> the n payloads joined (== b"".join(pack_records(kv, t)))."""
    return _record_rows(kv, t).numpy().tobytes()


def record_views(data: bytes, n: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """n payloads joined (data), each of `shape` [2, layers, heads, t, head_dim] -> [n, *shape], a read-only view
    of data itself (no copy): callers only read it (copy from it, slice it, move it)."""
    with warnings.catch_warnings():  # torch warns that bytes are not writable: nothing writes this view
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(data, dtype=torch.uint8)
    return flat.view(dtype).view(n, *shape)


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
        two, layers, heads, _, dim = pool.block.shape
        self.shape = (two, layers, heads, record_tokens, dim)  # one record
        self.record_bytes = two * layers * heads * record_tokens * dim * pool.block.element_size()

    def _select(self, slots: list[int]) -> torch.Tensor:
        idx = torch.tensor(slots, dtype=torch.int64, device=self.pool.block.device)
        return self.pool.block.index_select(3, idx)  # [2, L, H, n*T, D]

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
        self._copy_in(slots, [record_views(p, 1, self.shape, self.pool.block.dtype)[0] for p in payloads])

    def write_joined(self, slots: list[int], data: bytes) -> None:
        """slots: n * record_tokens slots <- data, n payloads joined (a refused call leaves the pool as it was)."""
        n = check_joined(slots, data, self.t, self.record_bytes)
        block = self.pool.block
        if self.t == 1:  # PD's one-token records: [2, L, H, n, D], a view of data
            kv = unpack_records(data, n, self.shape, block.dtype)
            runs = slot_runs(slots) if block.device.type == "cpu" else []  # a device pool: index_copy_ only
            if runs and len(runs) * 4 <= n:
                # a strided copy per run of consecutive slots (a page or more): faster than index_copy_,
                # which moves element by element (docs/PERFORMANCE.md, PD's one-token writes)
                for i, s, r in runs:
                    block[:, :, :, s:s + r].copy_(kv[:, :, :, i:i + r])
                return
            block.index_copy_(3, torch.tensor(slots, dtype=torch.int64, device=block.device), kv.to(block.device))
            return
        self._copy_in(slots, list(record_views(data, n, self.shape, block.dtype)))

    def _copy_in(self, slots: list[int], records: list[torch.Tensor]) -> None:
        """records[i] [2, layers, heads, t, head_dim] -> slots[i * t:(i + 1) * t]: straight from the payload
        bytes into the pool, one index_copy_ per record (a transposing copy of all records first costs ~7x for
        32-token records: docs/PERFORMANCE.md)."""
        block, t = self.pool.block, self.t
        idx = torch.tensor(slots, dtype=torch.int64, device=block.device)
        for i, kv in enumerate(records):
            block.index_copy_(3, idx[i * t:(i + 1) * t], kv.to(block.device))
