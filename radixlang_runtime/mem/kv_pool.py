"""KV pool: per layer a K and a V buffer indexed by token slot, and the `req_to_token` table."""

from __future__ import annotations

import torch


class KVPool:
    def __init__(self, num_slots: int, num_layers: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, table_rows: int, context_len: int):
        self.num_slots = num_slots
        # k_buffers[l], v_buffers[l]: [num_slots, kv_heads, head_dim]
        self.k_buffers = [torch.zeros(num_slots, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffers = [torch.zeros(num_slots, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        # req_to_token[row, pos] = slot of position pos of the request in that row. [table_rows, context_len] int64.
        # Entries past a request's length are stale but always valid slot numbers (gathers stay in range).
        self.req_to_token = torch.zeros(table_rows, context_len, dtype=torch.int64, device=device)

    @staticmethod
    def bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def store(self, layer: int, out_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """out_loc: [T] slots; k, v: [T, kv_heads, head_dim]."""
        self.k_buffers[layer].index_copy_(0, out_loc, k)
        self.v_buffers[layer].index_copy_(0, out_loc, v)
