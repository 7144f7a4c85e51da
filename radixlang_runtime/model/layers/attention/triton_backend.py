"""The Triton attention backend: kernels/extend_attention.py and kernels/decode_attention.py.

The default on CUDA; on CPU it runs only under TRITON_INTERPRET=1 (tests). Metadata per step is a
handful of [B] int64 tensors; both kernels read K/V in place from the pool through req_to_token.
Decode with cascade on (attention/cascade.py): requests that share a cached prefix read it once per
group (kernels/prefix_attention.py), then each its own tail with that result as the prior.
Sliding windows (self.windows): extend bounds its key loops by the window (kernels/extend_attention.py);
decode reads each request's last w positions (k_begin = seq_len - w), without cascade on those layers.
Chunked local attention (self.chunks, Llama 4: the query at position p sees [p - p % c, p]): extend bounds and
masks its key loops by each query's chunk (the kernel's `chunk`); decode reads the new token's chunk
(k_begin = its first position), without cascade on those layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from radixlang_runtime.model.layers.attention.base import AttentionBackend
from radixlang_runtime.model.layers.attention.cascade import MIN_SHARED, CascadePlan, plan_cascade
from radixlang_runtime.model.executor.forward_batch import ForwardBatch


@dataclass
class TritonMeta:
    max_len: int  # longest extend (extend) or sequence (decode): sizes the grid without a device sync
    prefix_lens: Optional[torch.Tensor] = None  # [B] int64 (extend only)
    extend_lens: Optional[torch.Tensor] = None  # [B] int64
    extend_starts: Optional[torch.Tensor] = None  # [B] int64 offset of each request's new tokens in T
    cascade: Optional[CascadePlan] = None  # decode: the shared-prefix groups of this step, if any
    # with a plan: the shared part's output [B, H, D] and log-sum-exp [B, H], float32; each layer rewrites
    # the grouped rows, the others stay zeros / -inf (weight 0 in the merge)
    prior_o: Optional[torch.Tensor] = None
    prior_lse: Optional[torch.Tensor] = None
    win_begin: Optional[dict] = None  # decode: window w -> [B] int64 max(0, seq_len - w)
    chunk_begin: Optional[dict] = None  # decode: chunk c -> [B] int64 the new token's chunk's first position
    split_len: int = 256  # decode: keys per split of the grid (larger under a graph's bound: at most 64 splits)


class TritonAttentionBackend(AttentionBackend):
    supports_sinks = True  # both kernels take them (the decode kernel merges them after a cascade prior)
    supports_chunks = True

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, soft_cap: float = 0.0):
        super().__init__(num_heads, num_kv_heads, head_dim, scale)
        self.soft_cap = soft_cap
        # decode reads a shared prefix once per group; False: one pass per request, e.g. the deterministic mode
        self.cascade = True
        from radixlang_kernels.decode_attention import decode_attention
        from radixlang_kernels.extend_attention import extend_attention
        from radixlang_kernels.prefix_attention import shared_prefix_attention

        self._decode, self._extend, self._prefix = decode_attention, extend_attention, shared_prefix_attention

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        dev = fb.input_ids.device
        if fb.is_decode:
            bound = fb.graph_max_len  # under a graph: the context length (the grid's empty splits exit at once)
            fb.attn_meta = TritonMeta(bound or max(fb.seq_lens_cpu), split_len=256 * max(1, -(-bound // (256 * 64))))
            fb.attn_meta.win_begin = {w: (fb.seq_lens - w).clamp(min=0) for w in self.distinct_windows}
            fb.attn_meta.chunk_begin = {c: torch.div(fb.seq_lens - 1, c, rounding_mode="floor") * c
                                        for c in self.distinct_chunks}
            shareable = [n - 1 for n in fb.seq_lens_cpu]  # all but the new token are in the pool
            # else no group (or a graph's step): skip the sync
            if self.cascade and not bound and len(self.cascade_dims()) == 1 and \
                    sum(n >= MIN_SHARED for n in shareable) >= 2:
                B = fb.batch_size
                plan = plan_cascade(fb.kv_pool.req_to_token, fb.req_rows.tolist(), shareable, list(range(B)), [1] * B)
                if plan is not None:
                    fb.attn_meta.cascade = plan
                    fb.attn_meta.prior_o = torch.zeros(B, self.num_heads, self.prior_dim, dtype=torch.float32,
                                                       device=dev)
                    fb.attn_meta.prior_lse = torch.full((B, self.num_heads), float("-inf"), dtype=torch.float32,
                                                        device=dev)
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
                         m.prefix_lens, m.extend_lens, m.extend_starts, self.scale, self.soft_cap, m.max_len,
                         window=self.window(layer), sinks=self.sinks.get(layer), chunk=self.chunk(layer))
        return o.view(q.shape[0], -1)

    def forward_decode(self, q: torch.Tensor, layer: int, fb: ForwardBatch) -> torch.Tensor:
        m: TritonMeta = fb.attn_meta
        pool = fb.kv_pool
        kb, vb = pool.k_buffers[layer], pool.v_buffers[layer]
        w, c, sinks = self.window(layer), self.chunk(layer), self.sinks.get(layer)
        if c:  # the new token's chunk (at most c positions), one pass
            o = self._decode(q, kb, vb, pool.req_to_token, fb.req_rows, fb.seq_lens, self.scale, self.soft_cap,
                             min(m.max_len, c), m.split_len, k_begin=m.chunk_begin[c], sinks=sinks)
            return o.view(q.shape[0], -1)
        if w:  # the last w positions, one pass (a shared prefix mostly lies outside the window)
            o = self._decode(q, kb, vb, pool.req_to_token, fb.req_rows, fb.seq_lens, self.scale, self.soft_cap,
                             min(m.max_len, w), m.split_len, k_begin=m.win_begin[w], sinks=sinks)
            return o.view(q.shape[0], -1)
        p = m.cascade
        if p is not None:  # the shared prefixes once per group, into the prior each request's tail merges
            self._prefix(q, kb, vb, pool.req_to_token, p.group_rows, p.group_lens, p.q_index, p.group_starts,
                         self.scale, self.soft_cap, p.max_group_rows, p.max_shared, out_o=m.prior_o,
                         out_lse=m.prior_lse)
        o = self._decode(q, kb, vb, pool.req_to_token, fb.req_rows, fb.seq_lens, self.scale, self.soft_cap,
                         m.max_len, m.split_len, k_begin=None if p is None else p.k_begin, prior_o=m.prior_o,
                         prior_lse=m.prior_lse, sinks=sinks)
        return o.view(q.shape[0], -1)
