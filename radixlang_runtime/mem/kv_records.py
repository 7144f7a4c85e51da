"""KVRecordPort: K/V of token slots <-> record payload bytes, for the tiers (mem/hicache.py) and PD (disagg/).

A record's payload is its K and V for all layers, [2, layers, kv_heads, record_tokens, head_dim] in
the pool's dtype, contiguous, as raw bytes (the pool is [2, layers, kv_heads, num_slots, head_dim]:
one index_select over the slot dimension reads a batch of records, one index_copy_ writes them).
pack_records / unpack_records are that layout, the one serializer: model/tp_kv.py builds the same records
from the K/V heads of every tensor-parallel rank.
"""

from __future__ import annotations

import torch

from radixlang_runtime.mem.kv_pool import KVPool


def pack_records(kv: torch.Tensor, t: int) -> list[bytes]:
    """kv [2, layers, heads, n * t, head_dim] (any device) -> n payloads of t tokens each."""
    two, layers, heads, nt, dim = kv.shape
    n = nt // t
    kv = kv.reshape(two, layers, heads, n, t, dim).permute(3, 0, 1, 2, 4, 5).contiguous().cpu()
    raw = kv.view(n, -1).view(torch.uint8)  # [n, record_bytes]
    return [bytes(raw[i].numpy()) for i in range(n)]


def unpack_records(data: bytes, n: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """n payloads joined (data), each of `shape` [2, layers, heads, t, head_dim] -> [2, layers, heads, n * t,
    head_dim] on the CPU."""
    two, layers, heads, t, dim = shape
    kv = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).view(n, two, layers, heads, t, dim)
    return kv.permute(1, 2, 3, 0, 4, 5).reshape(two, layers, heads, n * t, dim)


class KVRecordPort:
    def __init__(self, pool: KVPool, record_tokens: int):
        self.pool = pool
        self.t = record_tokens
        two, layers, heads, _, dim = pool.block.shape
        self.shape = (two, layers, heads, record_tokens, dim)  # one record
        self.record_bytes = two * layers * heads * record_tokens * dim * pool.block.element_size()

    def read_records(self, slots: list[int]) -> list[bytes]:
        """slots: n * record_tokens slots, record after record -> n payloads."""
        idx = torch.tensor(slots, dtype=torch.int64, device=self.pool.block.device)
        return pack_records(self.pool.block.index_select(3, idx), self.t)  # [2, L, H, n*T, D]

    def write_records(self, slots: list[int], payloads: list[bytes]) -> None:
        n = len(payloads)
        if len(slots) != n * self.t or any(len(p) != self.record_bytes for p in payloads):
            raise ValueError(f"write_records: {len(slots)} slots for {n} records of {self.t} tokens, "
                             f"payloads of {self.record_bytes} bytes each")
        block = self.pool.block
        kv = unpack_records(b"".join(payloads), n, self.shape, block.dtype).to(block.device)
        block.index_copy_(3, torch.tensor(slots, dtype=torch.int64, device=block.device), kv)
