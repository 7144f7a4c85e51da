"""KV pool: per layer a K and a V buffer indexed by token slot, and the `req_to_token` table.

Layout: head-major, [kv_heads, num_slots, head_dim]. Gathering a batch's slots along dim 1 then
yields [kv_heads, B, L, head_dim] directly, the layout batched matmul wants (no transpose copy);
on CPU that halves decode attention time against the token-major [num_slots, kv_heads, head_dim].

Latent layout (v_view set: multi-head latent attention, model/layers/mla_spec.py): a token's entry is one
buffer per layer, [kv_heads, num_slots, head_dim], and V is a view of its first v_view lanes (no second
copy): the block is [1, layers, kv_heads, num_slots, head_dim]. Whatever moves slots (the allocator, the
radix cache, retraction, kv_records for the hierarchical tiers and PD) moves the block's dim 3 either way.
"""

from __future__ import annotations

from typing import Optional

import torch

from radixlang_runtime.mem.kv_memory import kv_block, lazy_pages
from radixlang_runtime.mem.kv_prefault import KVPrefaulter


class KVPool:
    def __init__(self, num_slots: int, num_layers: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, table_rows: int, context_len: int,
                 v_view: Optional[int] = None):
        self.num_slots = num_slots
        self.v_view = v_view  # the latent layout's V width (module docstring); None: separate K and V
        # One block [2, layers, kv_heads, num_slots, head_dim], lazily zero when large (mem/kv_memory.py);
        # k_buffers[l] = block[0, l], v_buffers[l] = block[1, l]: [kv_heads, num_slots, head_dim], contiguous.
        block = kv_block((1 if v_view else 2, num_layers, kv_heads, num_slots, head_dim), dtype, device)
        self.nbytes = block.numel() * block.element_size()
        self.block = block  # mem/kv_records.py copies whole records of slots in and out of it
        self.lazy = lazy_pages(self.nbytes, device)  # pages resident once written: a prefaulter may run ahead
        self.prefaulter: Optional[KVPrefaulter] = None  # set by whoever knows the allocator (wiring.py)
        self.k_buffers = [block[0, i] for i in range(num_layers)]
        self.v_buffers = [block[0, i, ..., :v_view] if v_view else block[1, i] for i in range(num_layers)]
        # req_to_token[row, pos] = slot of position pos of the request in that row. [table_rows, context_len] int64.
        # Entries past a request's length are stale but always valid slot numbers (gathers stay in range).
        self.req_to_token = torch.zeros(table_rows, context_len, dtype=torch.int64, device=device)

    @staticmethod
    def bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                        v_view: Optional[int] = None) -> int:
        return (1 if v_view else 2) * num_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def store(self, layer: int, out_loc: torch.Tensor, k: torch.Tensor, v: Optional[torch.Tensor]) -> None:
        """out_loc: [T] slots; k, v: [T, kv_heads, head_dim] (latent layout: k is the whole entry, v None)."""
        self.k_buffers[layer].index_copy_(1, out_loc, k.transpose(0, 1))
        if self.v_view:
            return
        self.v_buffers[layer].index_copy_(1, out_loc, v.transpose(0, 1))

    def flat_index(self, slots: torch.Tensor) -> torch.Tensor:
        """slots [N] -> rows [kv_heads * N] of a buffer viewed as [kv_heads * num_slots, head_dim]."""
        heads = torch.arange(self.k_buffers[0].shape[0], device=slots.device)
        return (heads[:, None] * self.num_slots + slots[None, :]).reshape(-1)

    def gather(self, layer: int, flat_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """flat_rows from flat_index(slots) -> K, V each [kv_heads, N, head_dim], contiguous.

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
