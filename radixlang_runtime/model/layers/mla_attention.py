"""Multi-head latent attention (DeepSeek V2 / V3, Kimi K2) over the KV pool's latent layout (model/layers/mla_spec.py).

Per token the pool holds [latent (C = kv_lora_rank), k_rope (R = qk_rope_head_dim)]: one entry, V its first C
lanes. kv_b_proj's weight [H (nope + v), C] splits per head into W_UK [nope, C] and W_UV [v, C].

- Prefill (extend) runs the expanded form, as transformers does: each request's entries (its cached prefix
  and its new tokens) go through kv_b_proj to per-head keys [k_nope, k_rope] and values, and attention is
  causal per request (bottom-right aligned over a cached prefix).
- Decode runs the absorbed form: q_nope is multiplied by W_UK into latent space, attention is MQA of the H
  query heads over the entries themselves ([q_lat, q_rope] . [latent, k_rope]; the values are the latents),
  and the output latent is multiplied by W_UV. No per-token expansion of the cache: decode reads C + R lanes
  per cached token instead of H (2 nope + R + v) after an expansion matmul. `absorbed = False` runs decode
  in the expanded form (the same numbers up to rounding; docs/MODELS.md compares the two). On CPU with the C
  kernels (use_cpu_kernel) the attention over the entries is radixlang_kernels' mla_decode, reading the pool in
  place (each entry once for a block of heads); with --attention-backend triton (use_triton) the Triton kernel
  radixlang_kernels/mla_decode_triton.py, reading the pool in place too; else SDPA over the gathered entries.

Tensor parallel: each rank runs its Shard's query heads (q_proj / q_b_proj rows, kv_b_proj's rows of those heads,
o_proj's columns; the row-parallel o_proj's output is summed over the ranks, its bias added by rank 0 only). The
latent entry is every head's, so each rank computes and stores the whole entry (q_a_proj, kv_a_proj_with_mqa and
their norms replicated): every rank's pool holds the same latent KV.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from radixlang_kernels import cpu_ops
from radixlang_runtime.model.layers.attention.torch_backend import causal_mask
from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.layers.rms_norm import RMSNorm
from radixlang_runtime.model.executor.parallel import Reduce, Shard
from radixlang_runtime.model.layers.rotary import Rotary

NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm: transformers builds them with the RMSNorm default


@dataclass
class MLAMeta:
    """One step's indexing, shared by every layer. decode: slots [B, L_max] of each row's sequence and the
    padding mask [B, 1, 1, L_max] (None when lengths are equal); extend: per request its slots [p + n] when it
    has a cached prefix (else None: its new entries are used as computed) and its causal mask [n, p + n]."""

    slots: Optional[torch.Tensor] = None
    keep_mask: Optional[torch.Tensor] = None
    starts: tuple[int, ...] = ()
    prefix_slots: tuple[Optional[torch.Tensor], ...] = ()
    masks: tuple[Optional[torch.Tensor], ...] = ()


def triton_mla():
    """radixlang_kernels.mla_decode_triton (imported on first use: Triton is optional)."""
    from radixlang_kernels import mla_decode_triton

    return mla_decode_triton


def mla_metadata(fb: ForwardBatch) -> MLAMeta:
    pool, dev = fb.kv_pool, fb.kv_pool.req_to_token.device
    if fb.is_decode:
        L = max(fb.seq_lens_cpu)
        slots = pool.req_to_token[fb.req_rows, :L]  # [B, L]
        keep = None
        if min(fb.seq_lens_cpu) != L:
            keep = (torch.arange(L, device=dev)[None, :] < fb.seq_lens[:, None]).view(fb.batch_size, 1, 1, L)
        return MLAMeta(slots=slots, keep_mask=keep)
    starts, slots, masks, off = [], [], [], 0
    for i, (p, n) in enumerate(zip(fb.prefix_lens_cpu, fb.extend_lens_cpu)):
        starts.append(off)
        off += n
        slots.append(None if p == 0 else pool.req_to_token[fb.req_rows[i], : p + n])
        masks.append(None if p == 0 else causal_mask(p, n, 0, dev))
    return MLAMeta(starts=tuple(starts), prefix_slots=tuple(slots), masks=tuple(masks))


def rope_interleaved(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [T, heads, R]: adjacent pairs (x0, x1), (x2, x3).. each rotated by one frequency (transformers'
    apply_rotary_pos_emb_interleave); the output holds the rotated even lanes, then the odd ones (every
    query and key alike, so their dot products are those of the pairwise layout)."""
    cos, sin = cos_sin  # [T, 1, R] (the two halves equal), [T, 1, R / 2]
    c = cos[..., : cos.shape[-1] // 2]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * c - x2 * sin, x2 * c + x1 * sin], dim=-1)


class MLAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, shard: Shard, reduce: Reduce):
        super().__init__()
        m = cfg.mla
        self.layer_id, self.m, self.reduce = layer_id, m, reduce
        self.h, self.head_start, self.rank = shard.q_count, shard.q_start, shard.rank  # this rank's query heads
        qd = m.qk_nope_head_dim + m.qk_rope_head_dim
        hidden, bias = cfg.hidden_size, cfg.attention_bias
        if m.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, self.h * qd, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, m.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, NORM_EPS)
            self.q_b_proj = nn.Linear(m.q_lora_rank, self.h * qd, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, m.entry_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, NORM_EPS)
        self.kv_b_proj = nn.Linear(m.kv_lora_rank, self.h * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        self.o_proj = nn.Linear(self.h * m.v_head_dim, hidden, bias=bias)
        self.absorbed = True  # decode in the absorbed form (module docstring)
        self.use_cpu_kernel = False  # the absorbed decode's attention in C (cpu_ops.mla_decode)
        self.use_triton = False  # that attention in Triton (mla_decode_triton.py): --attention-backend triton
        self.w_uk: Optional[torch.Tensor] = None  # [H, nope, C], set by absorb()
        self.w_uv: Optional[torch.Tensor] = None  # [H, v, C]

    def absorb(self) -> None:
        """After loading (before any packing replaces kv_b_proj): W_UK and W_UV, views of kv_b_proj's weight."""
        m = self.m
        w = self.kv_b_proj.weight.detach().view(self.h, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)
        self.w_uk, self.w_uv = w[:, : m.qk_nope_head_dim], w[:, m.qk_nope_head_dim:]

    def load(self, take, put, src: str, dst: str, bias: bool) -> None:
        """The checkpoint's self_attn.* (src) into this module (dst): this rank's heads of the per-head
        projections, the latent's projections whole."""
        m, h0, h1 = self.m, self.head_start, self.head_start + self.h
        qd, kvd = m.qk_nope_head_dim + m.qk_rope_head_dim, m.qk_nope_head_dim + m.v_head_dim
        put(dst + "kv_a_proj_with_mqa.weight", take(src + "kv_a_proj_with_mqa.weight"))
        put(dst + "kv_a_layernorm.weight", take(src + "kv_a_layernorm.weight"))
        put(dst + "kv_b_proj.weight", take(src + "kv_b_proj.weight", rows=(h0 * kvd, h1 * kvd)))
        put(dst + "o_proj.weight", take(src + "o_proj.weight", cols=(h0 * m.v_head_dim, h1 * m.v_head_dim)))
        if m.q_lora_rank is None:
            put(dst + "q_proj.weight", take(src + "q_proj.weight", rows=(h0 * qd, h1 * qd)))
        else:
            put(dst + "q_a_proj.weight", take(src + "q_a_proj.weight"))
            put(dst + "q_a_layernorm.weight", take(src + "q_a_layernorm.weight"))
            put(dst + "q_b_proj.weight", take(src + "q_b_proj.weight", rows=(h0 * qd, h1 * qd)))
        if bias:
            put(dst + "kv_a_proj_with_mqa.bias", take(src + "kv_a_proj_with_mqa.bias"))
            o_bias = take(src + "o_proj.bias")  # summed over the ranks by the reduce: rank 0 adds it
            put(dst + "o_proj.bias", o_bias if self.rank == 0 else torch.zeros_like(o_bias))
            if m.q_lora_rank is not None:
                put(dst + "q_a_proj.bias", take(src + "q_a_proj.bias"))

    def _rope(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return rope_interleaved(x, fb.rope_cos_sin) if self.m.rope_interleave else Rotary.apply(x, fb.rope_cos_sin)

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        m, T = self.m, x.shape[0]
        q = self.q_proj(x) if m.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_nope, q_pe = q.view(T, self.h, -1).split([m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        entry = torch.cat([self.kv_a_layernorm(latent.contiguous()),
                           self._rope(k_pe.unsqueeze(1), fb).squeeze(1)], dim=-1)  # [T, C + R]
        q_pe = self._rope(q_pe, fb)  # [T, H, R]
        fb.kv_pool.store(self.layer_id, fb.out_loc, entry.unsqueeze(1), None)
        if fb.is_decode and self.absorbed:
            o = self._decode_absorbed(q_nope, q_pe, fb)
        elif fb.is_decode:
            o = self._decode_expanded(torch.cat([q_nope, q_pe], dim=-1), fb)
        else:
            o = self._extend(torch.cat([q_nope, q_pe], dim=-1), entry, fb)
        out = self.o_proj(o.reshape(T, self.h * m.v_head_dim))
        return out if self.reduce is None else self.reduce(out)

    def _entries(self, fb: ForwardBatch, slots: torch.Tensor) -> torch.Tensor:
        """slots [...] -> the pool's entries [..., C + R] of this layer."""
        buf = fb.kv_pool.k_buffers[self.layer_id]  # [1, num_slots, C + R]
        return buf[0].index_select(0, slots.reshape(-1)).view(*slots.shape, buf.shape[-1])

    def _expand(self, entries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """entries [..., L, C + R] -> keys [..., H, L, nope + R], values [..., H, L, v]."""
        m = self.m
        latent, k_pe = entries.split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(latent.reshape(-1, m.kv_lora_rank))  # 2-D rows: what packed linears take
        kv = kv.view(*latent.shape[:-1], self.h, -1).transpose(-3, -2)  # [..., H, L, nope + v]
        k_nope, v = kv.split([m.qk_nope_head_dim, m.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.unsqueeze(-3).expand(*k_nope.shape[:-1], m.qk_rope_head_dim)], dim=-1)
        return k, v

    def _extend(self, q: torch.Tensor, entry: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """The expanded form per request: q [T, H, nope + R] -> [T, H, v]."""
        meta: MLAMeta = fb.attn_meta
        out = q.new_empty(q.shape[0], self.h, self.m.v_head_dim)
        for i, n in enumerate(fb.extend_lens_cpu):
            s = meta.starts[i]
            slots = meta.prefix_slots[i]
            k, v = self._expand(entry[s:s + n] if slots is None else self._entries(fb, slots))  # [H, L, *]
            mask = meta.masks[i]
            o = F.scaled_dot_product_attention(q[s:s + n].transpose(0, 1), k, v, attn_mask=mask,
                                               is_causal=mask is None, scale=self.m.softmax_scale)
            out[s:s + n] = o.transpose(0, 1)
        return out

    def _decode_expanded(self, q: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """q [B, H, nope + R] over every row's expanded keys / values -> [B, H, v]."""
        meta: MLAMeta = fb.attn_meta
        k, v = self._expand(self._entries(fb, meta.slots))  # [B, H, L, *]
        o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=meta.keep_mask,
                                           scale=self.m.softmax_scale)  # [B, H, 1, v]
        return o.squeeze(2)

    def _decode_absorbed(self, q_nope: torch.Tensor, q_pe: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """MQA over the latent entries: q_nope [B, H, nope] -> W_UK -> [B, H, C]; with q_pe [B, H, R] against
        entries [B, L, C + R]; values = the latents [B, L, C]; the output latent -> W_UV -> [B, H, v]."""
        meta: MLAMeta = fb.attn_meta
        q_lat = torch.einsum("bhn,hnc->bhc", q_nope, self.w_uk)
        qf = torch.cat([q_lat, q_pe], dim=-1)  # [B, H, C + R]: H queries of one KV head
        C, pool = self.m.kv_lora_rank, fb.kv_pool
        if self.use_triton:
            o = triton_mla().mla_decode(qf, pool.k_buffers[self.layer_id][0], pool.req_to_token, fb.req_rows,
                                        fb.seq_lens, C, self.m.softmax_scale, max(fb.seq_lens_cpu))  # [B, H, C]
        elif self.use_cpu_kernel:
            o = cpu_ops.mla_decode(qf, pool.k_buffers[self.layer_id][0], pool.req_to_token, fb.req_rows,
                                   fb.seq_lens, C, self.m.softmax_scale)  # [B, H, C]
        else:
            kv = self._entries(fb, meta.slots).unsqueeze(1)  # [B, 1, L, C + R]
            o = F.scaled_dot_product_attention(qf.unsqueeze(1), kv, kv[..., :C], attn_mask=meta.keep_mask,
                                               scale=self.m.softmax_scale).squeeze(1)  # [B, H, C]
        return torch.einsum("bhc,hvc->bhv", o, self.w_uv)
