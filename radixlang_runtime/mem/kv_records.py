"""KVRecordPort: K/V of token slots <-> record payload bytes, for the tiers (mem/hicache.py).

A record's payload is its K and V for all layers, [2, layers, kv_heads, record_tokens, head_dim] in
the pool's dtype, contiguous, as raw bytes (the pool is [2, layers, kv_heads, num_slots, head_dim]:
one index_select over the slot dimension reads a batch of records, one index_copy_ writes them).
"""

from __future__ import annotations

import torch

from radixlang_runtime.mem.kv_pool import KVPool


class KVRecordPort:
    def __init__(self, pool: KVPool, record_tokens: int):
        self.pool = pool
        self.t = record_tokens
        two, layers, heads, _, dim = pool.block.shape
        self.shape = (two, layers, heads, record_tokens, dim)  # one record
        self.record_bytes = two * layers * heads * record_tokens * dim * pool.block.element_size()

    def read_records(self, slots: list[int]) -> list[bytes]:
        """slots: n * record_tokens slots, record after record -> n payloads."""
        n = len(slots) // self.t
        idx = torch.tensor(slots, dtype=torch.int64, device=self.pool.block.device)
        kv = self.pool.block.index_select(3, idx)  # [2, L, H, n*T, D]
        two, layers, heads, t, dim = self.shape
        kv = kv.view(two, layers, heads, n, t, dim).permute(3, 0, 1, 2, 4, 5).contiguous().cpu()
        raw = kv.view(n, -1).view(torch.uint8)  # [n, record_bytes]
        return [bytes(raw[i].numpy()) for i in range(n)]

    def write_records(self, slots: list[int], payloads: list[bytes]) -> None:
        n = len(payloads)
        if len(slots) != n * self.t or any(len(p) != self.record_bytes for p in payloads):
            raise ValueError(f"write_records: {len(slots)} slots for {n} records of {self.t} tokens, "
                             f"payloads of {self.record_bytes} bytes each")
        block = self.pool.block
        raw = torch.frombuffer(bytearray(b"".join(payloads)), dtype=torch.uint8)
        two, layers, heads, t, dim = self.shape
        kv = raw.view(block.dtype).view(n, two, layers, heads, t, dim).permute(1, 2, 3, 0, 4, 5)
        kv = kv.reshape(two, layers, heads, n * t, dim).to(block.device)
        block.index_copy_(3, torch.tensor(slots, dtype=torch.int64, device=block.device), kv)
