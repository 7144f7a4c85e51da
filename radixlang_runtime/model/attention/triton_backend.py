"""The Triton attention backend: kernels/extend_attention.py and kernels/decode_attention.py.

The default on CUDA; on CPU it runs only under TRITON_INTERPRET=1 (tests). Metadata per step is a
handful of [B] int64 tensors; both kernels read K/V in place from the pool through req_to_token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from radixlang_runtime.model.attention.base import AttentionBackend
from radixlang_runtime.model.forward_batch import ForwardBatch


@dataclass
class TritonMeta:
    max_len: int  # longest extend (extend) or sequence (decode): sizes the grid without a device sync
    prefix_lens: Optional[torch.Tensor] = None  # [B] int64 (extend only)
    extend_lens: Optional[torch.Tensor] = None  # [B] int64
    extend_starts: Optional[torch.Tensor] = None  # [B] int64 offset of each request's new tokens in T


class TritonAttentionBackend(AttentionBackend):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, soft_cap: float = 0.0):
        super().__init__(num_heads, num_kv_heads, head_dim, scale)
        self.soft_cap = soft_cap
        from kernels.decode_attention import decode_attention
        from kernels.extend_attention import extend_attention

        self._decode, self._extend = decode_attention, extend_attention

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        dev = fb.input_ids.device
        if fb.is_decode:
            fb.attn_meta = TritonMeta(max(fb.seq_lens_cpu))
            return
        starts = [0]
        for n in fb.extend_lens_cpu[:-1]:
            starts.append(starts[-1] + n)
        fb.attn_meta = TritonMeta(
            max(fb.extend_lens_cpu), torch.tensor(fb.prefix_lens_cpu, dtype=torch.int64, device=dev),
            torch.tensor(fb.extend_lens_cpu, dtype=torch.int64, device=dev),
            torch.tensor(starts, dtype=torch.int64, device=dev))

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                       fb: ForwardBatch) -> torch.Tensor:
        m: TritonMeta = fb.attn_meta
        pool = fb.kv_pool
        o = self._extend(q, k, v, pool.k_buffers[layer], pool.v_buffers[layer], pool.req_to_token, fb.req_rows,
                         m.prefix_lens, m.extend_lens, m.extend_starts, self.scale, self.soft_cap, m.max_len)
        return o.view(q.shape[0], -1)

    def forward_decode(self, q: torch.Tensor, layer: int, fb: ForwardBatch) -> torch.Tensor:
        m: TritonMeta = fb.attn_meta
        pool = fb.kv_pool
        o = self._decode(q, pool.k_buffers[layer], pool.v_buffers[layer], pool.req_to_token, fb.req_rows,
                         fb.seq_lens, self.scale, self.soft_cap, m.max_len)
        return o.view(q.shape[0], -1)
