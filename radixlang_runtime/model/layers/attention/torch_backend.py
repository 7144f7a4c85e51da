"""Torch attention over the paged KV pool (CPU, and the reference for the Triton kernels).

Decode: one batched computation for all requests. Each request's slots are gathered through
req_to_token into a padded [B, L_max] block (one index_select per buffer, giving [Hkv, B, L_max, D]);
a mask hides the padding when lengths differ. GQA needs no K/V repeat: the G = H / Hkv query heads
of a KV head form the query axis of one [G, D] x [D, L] product.
Extend: a request without a cached prefix attends over its own new K/V (no gather); with a prefix,
its whole sequence is gathered from the pool and the causal mask is bottom-right aligned. When every
request is a fresh prompt of the same length, the whole batch is one SDPA call.
On CPU both phases go to the C kernels (radixlang_kernels.cpu_ops, bf16 and float32, which read cached K/V in
place) when the model's CpuPaths say so (`configure`, decided once from the CPU's capabilities);
without a plan (tests, other devices) the torch path above runs. The C path also runs cascade
attention (attention/cascade.py) when requests of the step share >= MIN_SHARED cached slots: the
shared prefix is read once per group instead of once per request (`cascade = False` turns it off:
the deterministic mode, which also runs decode rows through the extend kernel: model/executor/deterministic.py).
Sliding windows (self.windows, per layer): the query at position p sees keys at (p - w, p]. The torch
path masks them; the C decode reads each request's last w positions (k_begin = seq_len - w); the C
extend kernel masks in place (its `window`). Windowed layers never run cascade attention: a shared
prefix mostly lies outside the window, so those layers run the plain one-pass kernels (the step's plan
serves the full-attention layers). Soft-capping (self.soft_cap > 0, Gemma 2) runs on the torch path
only: `configure` then keeps the C attention kernels off (the runner says so in its paths).
Chunked local attention (self.chunks, per layer; Llama 4): the query at position p sees keys at
[p - p % c, p]. The torch path masks them; the C decode reads each request's last chunk (k_begin = the chunk's
first position); the C extend kernel runs each request's new tokens cut at chunk boundaries, one segment per
piece, whose cached prefix is read from the chunk's first position (PagedPrefix.k_begin): `chunk_segments`.
Chunked layers never run cascade attention.

Per-layer shapes (layer_shapes, Gemma 4): each layer attends at its own head_dim and KV heads; the layers the C
kernels do not fit (head_dim > 256: torch_layers) run the torch path beside the C path of the others, from a torch
metadata built alongside the C one (`meta.torch`); cascade attention runs where the C path's non-windowed layers
share one head_dim (its prior's width, prior_dim).

Attention sinks (self.sinks, gpt-oss) on every path: the torch path appends each head's sink logit to its
rows' scores before the softmax; the C kernels merge it as a prior of value 0 (cpu_ops.sink_prior), merged
into cascade attention's shared part where there is one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from radixlang_kernels import cpu_ops
from radixlang_runtime.model.layers.attention.base import AttentionBackend
from radixlang_runtime.model.layers.attention.cascade import CascadePlan, plan_cascade
from radixlang_runtime.model.executor.forward_batch import ForwardBatch


@dataclass
class DecodeMeta:
    # Hkv -> [Hkv * B * L_max] pool rows (KVPool.flat_rows), by head then request (padding: any valid slot)
    kv_rows: dict[int, torch.Tensor]
    max_len: int  # L_max
    keep_mask: Optional[torch.Tensor]  # [1, B, 1, L_max] bool, False on padding; None when lengths are equal
    win_masks: dict = field(default_factory=dict)  # window w -> [1, B, 1, L_max] bool: keep_mask & the window
    chunk_masks: dict = field(default_factory=dict)  # chunk c -> [1, B, 1, L_max] bool: the last token's chunk


@dataclass
class ExtendMeta:
    uniform: bool  # every request: no prefix, same extend length
    starts: list[int]  # offset of each request's tokens in T
    kv_rows: list[Optional[dict]]  # per request Hkv -> [Hkv * L_i] pool rows when it has a prefix, else None
    masks: list[Optional[torch.Tensor]]  # per request [n_i, L_i] bool (True = attend) when it has a prefix
    # C kernel inputs (CPU): offsets and lengths of each request's new tokens, [R] int64 each,
    # and its cached prefix length ([R] int64, None when no request has one).
    kernel_starts: Optional[torch.Tensor] = None
    kernel_lens: Optional[torch.Tensor] = None
    kernel_prefix_lens: Optional[torch.Tensor] = None
    cascade: Optional[CascadePlan] = None  # requests sharing cached slots (C kernel path only)
    prior: Optional[cpu_ops.Prior] = None  # with a plan: the shared part's output, rewritten by every layer
    win_masks: dict = field(default_factory=dict)  # window w -> per request [n_i, L_i] bool (torch path)
    chunk_masks: dict = field(default_factory=dict)  # chunk c -> per request [n_i, L_i] bool (torch path)
    chunk_segments: dict = field(default_factory=dict)  # chunk c -> ChunkSegments (C kernel path)
    torch: Optional["ExtendMeta"] = None  # C kernel path: the torch path's metadata for torch_layers


@dataclass
class ChunkSegments:
    """The C extend kernel's calls for a chunked layer: each request's new tokens cut at chunk boundaries; a
    segment starting at position p reads its prefix from p - p % c (the chunk's first position) to p - 1.
    [S] int64 each."""

    starts: torch.Tensor  # offset of the segment's tokens in T
    lens: torch.Tensor
    rows: torch.Tensor  # the request's req_to_token row
    prefix_lens: torch.Tensor  # the segment's first position
    k_begin: torch.Tensor  # its chunk's first position


def chunk_segments(chunk: int, starts: list[int], prefix_lens: list[int], extend_lens: list[int],
                   rows: list[int]) -> ChunkSegments:
    out: list[list[int]] = [[], [], [], [], []]
    for s, p, n, row in zip(starts, prefix_lens, extend_lens, rows):
        pos = p
        while pos < p + n:
            end = min(p + n, (pos // chunk + 1) * chunk)
            for col, value in zip(out, (s + pos - p, end - pos, row, pos, pos - pos % chunk)):
                col.append(value)
            pos = end
    return ChunkSegments(*(torch.tensor(col, dtype=torch.int64) for col in out))


@dataclass
class CDecodeMeta:
    """The C decode kernel reads req_to_token itself: only the groups are planned."""

    cascade: Optional[CascadePlan] = None
    prior: Optional[cpu_ops.Prior] = None  # with a plan: see ExtendMeta.prior
    rows: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # deterministic mode: arange(B), ones(B)
    win_begin: dict = field(default_factory=dict)  # window w -> [B] int64 max(0, seq_len - w): the first key
    chunk_begin: dict = field(default_factory=dict)  # chunk c -> [B] int64 the new token's chunk's first position
    torch: Optional[DecodeMeta] = None  # the torch path's metadata for torch_layers


class TorchAttentionBackend(AttentionBackend):
    supports_chunks = True
    supports_sinks = True

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__(num_heads, num_kv_heads, head_dim, scale)
        self.c_decode = False  # cpu_ops.paged_decode
        self.c_extend = False  # cpu_ops.extend_causal
        self.dpbf16 = False  # the extend kernel with VDPBF16PS
        self.cascade = True  # shared-prefix attention on the C path (False: one pass per request)
        self.rows_like_extend = False  # decode through the extend kernel (the deterministic mode)
        self.torch_layers: frozenset[int] = frozenset()  # layers the C kernels do not fit (layer_shapes): torch path
        self.prior_dim = head_dim  # the head_dim of the layers cascade attention runs on

    def configure(self, paths: "cpu_ops.CpuPaths") -> None:
        """Take the kernel choices of cpu_ops.plan() (they hold for every batch of this model); with a
        soft-cap the C attention kernels stay off (they do not implement it)."""
        self.c_decode, self.c_extend = (False, False) if self.soft_cap else (paths.c_decode, paths.c_extend)
        self.dpbf16 = "+dpbf16" in paths.extend_attention
        if self.layer_shapes is None:
            return
        self.torch_layers = frozenset(i for i, (h, d) in enumerate(self.layer_shapes)
                                      if not cpu_ops.c_attention_fits(d, self.num_heads, h))
        dims = self.cascade_dims(self.torch_layers)  # the C path's
        self.prior_dim = min(dims, default=self.head_dim)
        self.cascade = self.cascade and len(dims) == 1

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        c = self.c_decode if fb.is_decode else self.c_extend
        if fb.is_decode:
            meta = self._c_decode_meta(fb) if c else self._torch_decode_meta(fb)
        else:
            meta = self._c_extend_meta(fb) if c else self._torch_extend_meta(fb)
        if c and self.torch_layers:  # layers the C kernels do not fit run the torch path
            meta.torch = self._torch_decode_meta(fb) if fb.is_decode else self._torch_extend_meta(fb)
        fb.attn_meta = meta

    def _c_decode_meta(self, fb: ForwardBatch) -> CDecodeMeta:
        pool, B = fb.kv_pool, fb.batch_size
        meta = CDecodeMeta()
        if self.rows_like_extend:
            meta.rows = torch.arange(B, dtype=torch.int64), torch.ones(B, dtype=torch.int64)
        elif self.cascade and not fb.graph_max_len:  # a graph holds no host-planned groups
            meta.cascade = plan_cascade(pool.req_to_token, fb.req_rows.tolist(), [n - 1 for n in fb.seq_lens_cpu],
                                        list(range(B)), [1] * B)
            meta.prior = self._prior(meta.cascade, B, pool)
        meta.win_begin = {w: (fb.seq_lens - w).clamp_(min=0) for w in self.distinct_windows}
        meta.chunk_begin = {c: torch.div(fb.seq_lens - 1, c, rounding_mode="floor") * c
                            for c in self.distinct_chunks}
        return meta

    def _torch_decode_meta(self, fb: ForwardBatch) -> DecodeMeta:
        pool = fb.kv_pool
        max_len = max(fb.seq_lens_cpu)
        kv_slots = pool.req_to_token[fb.req_rows, :max_len].reshape(-1)
        keep_mask = None
        if min(fb.seq_lens_cpu) != max_len:
            ar = torch.arange(max_len, device=kv_slots.device)
            keep_mask = (ar[None, :] < fb.seq_lens[:, None]).view(1, fb.batch_size, 1, max_len)
        ar = torch.arange(max_len, device=kv_slots.device)
        win_masks = {}
        for w in self.distinct_windows:
            seen = (ar[None, :] < fb.seq_lens[:, None]) & (ar[None, :] >= fb.seq_lens[:, None] - w)
            win_masks[w] = seen.view(1, fb.batch_size, 1, max_len)
        chunk_masks = {}
        for c in self.distinct_chunks:
            first = torch.div(fb.seq_lens - 1, c, rounding_mode="floor") * c
            seen = (ar[None, :] < fb.seq_lens[:, None]) & (ar[None, :] >= first[:, None])
            chunk_masks[c] = seen.view(1, fb.batch_size, 1, max_len)
        return DecodeMeta(pool.flat_rows(kv_slots), max_len, keep_mask, win_masks, chunk_masks)

    def _c_extend_meta(self, fb: ForwardBatch) -> ExtendMeta:
        """The C kernel reads prefixes in place: no gather, no masks."""
        pool, fresh = fb.kv_pool, all(p == 0 for p in fb.prefix_lens_cpu)
        starts = [0, *itertools.accumulate(fb.extend_lens_cpu)][:-1]
        plan = None
        if self.cascade and not fresh:
            plan = plan_cascade(pool.req_to_token, fb.req_rows.tolist(), fb.prefix_lens_cpu, starts,
                                fb.extend_lens_cpu)
        meta = ExtendMeta(False, starts, [], [], torch.tensor(starts, dtype=torch.int64),
                          torch.tensor(fb.extend_lens_cpu, dtype=torch.int64),
                          None if fresh else torch.tensor(fb.prefix_lens_cpu, dtype=torch.int64), plan,
                          self._prior(plan, int(fb.input_ids.shape[0]), pool))
        rows = fb.req_rows.tolist() if self.distinct_chunks else []
        meta.chunk_segments = {c: chunk_segments(c, starts, fb.prefix_lens_cpu, fb.extend_lens_cpu, rows)
                               for c in self.distinct_chunks}
        return meta

    def _torch_extend_meta(self, fb: ForwardBatch) -> ExtendMeta:
        pool, fresh = fb.kv_pool, all(p == 0 for p in fb.prefix_lens_cpu)
        starts, slots, masks = [], [], []
        off = 0
        dev = pool.req_to_token.device
        for i, (p, n) in enumerate(zip(fb.prefix_lens_cpu, fb.extend_lens_cpu)):
            starts.append(off)
            off += n
            if p == 0:
                slots.append(None)
                masks.append(None)
                continue
            slots.append(pool.flat_rows(pool.req_to_token[fb.req_rows[i], : p + n]))
            # the query at absolute position p + j sees keys 0 .. p + j
            q_pos = torch.arange(p, p + n, device=dev)
            masks.append(torch.arange(p + n, device=dev)[None, :] <= q_pos[:, None])
        uniform = fresh and len(set(fb.extend_lens_cpu)) == 1
        win_masks = {w: [causal_mask(p, n, w, dev) for p, n in zip(fb.prefix_lens_cpu, fb.extend_lens_cpu)]
                     for w in self.distinct_windows}
        chunk_masks = {c: [chunk_mask(p, n, c, dev) for p, n in zip(fb.prefix_lens_cpu, fb.extend_lens_cpu)]
                       for c in self.distinct_chunks}
        return ExtendMeta(uniform, starts, slots, masks, win_masks=win_masks, chunk_masks=chunk_masks)

    def _prior(self, plan: Optional[CascadePlan], T: int, pool) -> Optional[cpu_ops.Prior]:
        if plan is None:
            return None
        return cpu_ops.empty_prior(T, self.num_heads, self.prior_dim, pool.k_buffers[0].dtype)

    def forward_decode(self, q: torch.Tensor, layer: int, fb: ForwardBatch) -> torch.Tensor:
        B, H, D = q.shape
        if isinstance(fb.attn_meta, CDecodeMeta) and layer not in self.torch_layers:  # the C kernel, from the pool
            pool, cm = fb.kv_pool, fb.attn_meta
            kb, vb, plan = pool.k_buffers[layer], pool.v_buffers[layer], cm.cascade
            w, c, sinks = self.window(layer), self.chunk(layer), self.sinks.get(layer)
            if c:  # the new token's chunk, one pass (no cascade)
                o = cpu_ops.paged_decode(q, kb, vb, pool.req_to_token, fb.req_rows, fb.seq_lens, self.scale,
                                         cm.chunk_begin[c], sinks=sinks)
                return o.view(B, H * D)
            if cm.rows is not None:
                o = cpu_ops.pool_rows_attention(q, kb, vb, pool.req_to_token, fb.req_rows, fb.seq_lens, *cm.rows,
                                                    self.scale, self.dpbf16, window=w, sinks=sinks)
                return o.view(B, H * D)
            if w:  # the last w positions of each request, one pass (no cascade: see the module docstring)
                o = cpu_ops.paged_decode(q, kb, vb, pool.req_to_token, fb.req_rows, fb.seq_lens, self.scale,
                                            cm.win_begin[w], sinks=sinks)
                return o.view(B, H * D)
            if plan is not None:
                cpu_ops.shared_prefix(q, kb, vb, pool.req_to_token, plan, self.scale, self.dpbf16, cm.prior)
            o = cpu_ops.paged_decode(q, kb, vb, pool.req_to_token, fb.req_rows, fb.seq_lens, self.scale,
                                        None if plan is None else plan.k_begin, cm.prior, sinks=sinks)
            return o.view(B, H * D)
        meta: DecodeMeta = fb.attn_meta.torch if isinstance(fb.attn_meta, CDecodeMeta) else fb.attn_meta
        hkv, L = fb.kv_pool.k_buffers[layer].shape[0], meta.max_len  # the layer's own KV heads
        k, v = fb.kv_pool.gather(layer, meta.kv_rows[hkv])
        k = k.view(hkv, B, L, D)
        v = v.view(hkv, B, L, D)
        qg = q.reshape(B, hkv, H // hkv, D).transpose(0, 1).contiguous()  # [Hkv, B, G, D]; a strided q slows SDPA
        # SDPA sees Hkv as the batch and B as the heads. NOTE: not a hand-written matmul/softmax: in
        # bf16 every new L makes oneDNN build a new matmul primitive, a cost paid again at every decode
        # step as L grows (docs/PERFORMANCE.md#torch-backend).
        w, c = self.window(layer), self.chunk(layer)
        mask = meta.chunk_masks[c] if c else (meta.win_masks[w] if w else meta.keep_mask)
        sink = self.sinks.get(layer)  # [H] -> [Hkv, 1, G, 1]: query head h = kv head * G + g
        sink = None if sink is None else sink.view(hkv, 1, H // hkv, 1)
        o = attend(qg, k, v, mask, self.scale, self.soft_cap, sink=sink)  # [Hkv, B, G, D]
        return o.transpose(0, 1).reshape(B, H * D)

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                       fb: ForwardBatch) -> torch.Tensor:
        meta: ExtendMeta = fb.attn_meta
        if meta.kernel_starts is not None and layer in self.torch_layers:
            meta = meta.torch  # a layer the C kernels do not fit
        T, H, D = q.shape
        hkv = k.shape[1]
        w, c, sinks = self.window(layer), self.chunk(layer), self.sinks.get(layer)
        if meta.kernel_starts is not None:  # the C kernel
            prefix, plan = None, meta.cascade
            if c:  # one call over the chunk segments, no cascade
                seg, pool = meta.chunk_segments[c], fb.kv_pool
                prefix = cpu_ops.PagedPrefix(pool.k_buffers[layer], pool.v_buffers[layer], pool.req_to_token,
                                             seg.rows, seg.prefix_lens, seg.k_begin)
                return cpu_ops.extend_causal(q, k, v, seg.starts, seg.lens, self.scale, prefix, self.dpbf16,
                                             sinks=sinks)
            if w:  # windowed layers: one pass over the whole prefix, masked in the kernel (no cascade)
                pool = fb.kv_pool
                if meta.kernel_prefix_lens is not None:
                    prefix = cpu_ops.PagedPrefix(pool.k_buffers[layer], pool.v_buffers[layer], pool.req_to_token,
                                                     fb.req_rows, meta.kernel_prefix_lens)
                return cpu_ops.extend_causal(q, k, v, meta.kernel_starts, meta.kernel_lens, self.scale, prefix,
                                                 self.dpbf16, window=w, sinks=sinks)
            if meta.kernel_prefix_lens is not None:
                pool = fb.kv_pool
                kb, vb = pool.k_buffers[layer], pool.v_buffers[layer]
                if plan is not None:
                    cpu_ops.shared_prefix(q, kb, vb, pool.req_to_token, plan, self.scale, self.dpbf16, meta.prior)
                prefix = cpu_ops.PagedPrefix(kb, vb, pool.req_to_token, fb.req_rows, meta.kernel_prefix_lens,
                                                 None if plan is None else plan.k_begin)
            return cpu_ops.extend_causal(q, k, v, meta.kernel_starts, meta.kernel_lens, self.scale, prefix,
                                             self.dpbf16, meta.prior, sinks=sinks)
        sink = None if sinks is None else sinks.view(H, 1, 1)  # query heads lead each request's [H, n, L] scores
        if meta.uniform and not w and not c and not self.soft_cap and sink is None:
            B, n = fb.batch_size, fb.extend_lens_cpu[0]
            qb = q.view(B, n, H, D).transpose(1, 2)  # [B, H, n, D]
            kb = k.view(B, n, hkv, D).transpose(1, 2)  # [B, Hkv, n, D]
            vb = v.view(B, n, hkv, D).transpose(1, 2)
            o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=self.scale, enable_gqa=True)
            return o.transpose(1, 2).reshape(T, H * D)
        out = torch.empty(T, H * D, dtype=q.dtype, device=q.device)
        for i, n in enumerate(fb.extend_lens_cpu):
            s = meta.starts[i]
            qi = q[s : s + n].transpose(0, 1)  # [H, n, D]
            mask = meta.chunk_masks[c][i] if c else (meta.win_masks[w][i] if w else meta.masks[i])  # None: causal
            if meta.kv_rows[i] is None:
                ki, vi = k[s : s + n].transpose(0, 1), v[s : s + n].transpose(0, 1)  # [Hkv, n, D]
            else:
                ki, vi = fb.kv_pool.gather(layer, meta.kv_rows[i][hkv])  # [Hkv, L, D]
            o = attend(qi, ki, vi, mask, self.scale, self.soft_cap, gqa=True, causal=mask is None, sink=sink)
            out[s : s + n] = o.transpose(0, 1).reshape(n, H * D)
        return out


def causal_mask(prefix: int, n: int, window: int, device) -> torch.Tensor:
    """[n, prefix + n] bool, True = attend: the query at position prefix + j sees keys 0 .. prefix + j,
    and with window > 0 only those at positions > prefix + j - window."""
    q_pos = torch.arange(prefix, prefix + n, device=device)[:, None]
    k_pos = torch.arange(prefix + n, device=device)[None, :]
    seen = k_pos <= q_pos
    return seen & (k_pos > q_pos - window) if window > 0 else seen


def chunk_mask(prefix: int, n: int, chunk: int, device) -> torch.Tensor:
    """[n, prefix + n] bool, True = attend: the query at position p = prefix + j sees keys at [p - p % chunk, p]."""
    q_pos = torch.arange(prefix, prefix + n, device=device)[:, None]
    k_pos = torch.arange(prefix + n, device=device)[None, :]
    return (k_pos <= q_pos) & (torch.div(k_pos, chunk, rounding_mode="floor") ==
                               torch.div(q_pos, chunk, rounding_mode="floor"))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], scale: float,
           soft_cap: float = 0.0, gqa: bool = False, causal: bool = False,
           sink: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q [..., Hq, n, D] over k / v [..., Hk, L, D] (gqa: Hq = G * Hk, query head h reads KV head h // G;
    else the head axes match or broadcast). mask: bool broadcastable to [..., n, L] (True = attend), None: every
    key; causal (with mask None): bottom-right aligned causal. soft_cap c > 0: scores c * tanh(scores / c) in
    float32, as transformers' eager attention computes them (SDPA has no soft-cap). sink: per query head
    logits broadcastable to [..., Hq, n, 1] (gpt-oss): each row's softmax runs over its scores and the sink,
    and the sink's share weighs no value (eager_attention_forward's concatenated column). Neither: SDPA."""
    if soft_cap <= 0 and sink is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None, scale=scale,
                                              enable_gqa=gqa)
    if gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # [..., Hq, n, L]
    if soft_cap > 0:
        s = soft_cap * torch.tanh(s / soft_cap)
    if mask is None and causal:
        n, L = s.shape[-2], s.shape[-1]
        mask = torch.ones(n, L, dtype=torch.bool, device=s.device).tril(L - n)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    if sink is None:
        return torch.matmul(s.softmax(-1), v.float()).to(q.dtype)
    s = torch.cat([s, sink.float().expand(*s.shape[:-1], 1)], dim=-1)  # [..., Hq, n, L + 1]
    return torch.matmul(s.softmax(-1)[..., :-1], v.float()).to(q.dtype)
