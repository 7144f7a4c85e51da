"""Torch attention over the paged KV pool (CPU, and the reference for the Triton kernels).

Decode: all requests in one SDPA call. K/V are gathered through req_to_token into a padded
[B, L_max] block; a boolean mask hides the padding when lengths differ. GQA runs without repeating
K/V: the G = H / Hkv query heads of a KV head ride as the query-length axis ([B, Hkv, G, D]).
Extend: one SDPA call per request (causal, bottom-right aligned over prefix + new tokens), or one
call for the whole batch when every request is a fresh prompt of the same length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from radixlang_runtime.model.attention.base import AttentionBackend
from radixlang_runtime.model.forward_batch import ForwardBatch


@dataclass
class DecodeMeta:
    kv_idx: torch.Tensor  # [B, L_max] int64 slots (past a request's length: any valid slot)
    mask: Optional[torch.Tensor]  # [B, 1, 1, L_max] bool, None when all lengths are equal


@dataclass
class ExtendMeta:
    uniform: bool  # every request: no prefix, same extend length
    starts: list[int]  # offset of each request's tokens in T
    kv_idx: list[Optional[torch.Tensor]]  # per request [L_i] slots, None when it has no prefix
    masks: list[Optional[torch.Tensor]]  # per request [n_i, L_i] bool, None when plain causal


class TorchAttentionBackend(AttentionBackend):
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        pool = fb.kv_pool
        if fb.is_decode:
            max_len = max(fb.seq_lens_cpu)
            kv_idx = pool.req_to_token[fb.req_rows, :max_len]
            mask = None
            if min(fb.seq_lens_cpu) != max_len:
                ar = torch.arange(max_len, device=kv_idx.device)
                mask = (ar[None, :] < fb.seq_lens[:, None]).view(fb.batch_size, 1, 1, max_len)
            fb.attn_meta = DecodeMeta(kv_idx, mask)
            return
        starts, idxs, masks = [], [], []
        off = 0
        for i, (p, n) in enumerate(zip(fb.prefix_lens_cpu, fb.extend_lens_cpu)):
            starts.append(off)
            off += n
            if p == 0:
                idxs.append(None)
                masks.append(None)
                continue
            idxs.append(pool.req_to_token[fb.req_rows[i], : p + n])
            # query i (absolute position p + i) sees keys 0 .. p + i
            q_pos = torch.arange(p, p + n, device=pool.req_to_token.device)
            masks.append(torch.arange(p + n, device=q_pos.device)[None, :] <= q_pos[:, None])
        uniform = all(p == 0 for p in fb.prefix_lens_cpu) and len(set(fb.extend_lens_cpu)) == 1
        fb.attn_meta = ExtendMeta(uniform, starts, idxs, masks)

    def forward_decode(self, q: torch.Tensor, layer: int, fb: ForwardBatch) -> torch.Tensor:
        meta: DecodeMeta = fb.attn_meta
        B, H, D = q.shape
        hkv = self.num_kv_heads
        k = fb.kv_pool.k_buffers[layer][meta.kv_idx].transpose(1, 2)  # [B, Hkv, L, D]
        v = fb.kv_pool.v_buffers[layer][meta.kv_idx].transpose(1, 2)  # [B, Hkv, L, D]
        qg = q.view(B, hkv, H // hkv, D)  # [B, Hkv, G, D]
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=meta.mask, scale=self.scale)
        return o.reshape(B, H * D)

    def forward_extend(self, q: torch.Tensor, layer: int, fb: ForwardBatch) -> torch.Tensor:
        meta: ExtendMeta = fb.attn_meta
        T, H, D = q.shape
        kb, vb = fb.kv_pool.k_buffers[layer], fb.kv_pool.v_buffers[layer]
        if meta.uniform:
            B, n = fb.batch_size, fb.extend_lens_cpu[0]
            loc = fb.out_loc.view(B, n)
            qb = q.view(B, n, H, D).transpose(1, 2)  # [B, H, n, D]
            kk = kb[loc].transpose(1, 2)  # [B, Hkv, n, D]
            vv = vb[loc].transpose(1, 2)
            o = F.scaled_dot_product_attention(qb, kk, vv, is_causal=True, scale=self.scale, enable_gqa=True)
            return o.transpose(1, 2).reshape(T, H * D)
        out = torch.empty(T, H * D, dtype=q.dtype, device=q.device)
        for i, n in enumerate(fb.extend_lens_cpu):
            s = meta.starts[i]
            qi = q[s : s + n].transpose(0, 1)  # [H, n, D]
            idx = meta.kv_idx[i] if meta.kv_idx[i] is not None else fb.out_loc[s : s + n]
            ki = kb[idx].transpose(0, 1)  # [Hkv, L, D]
            vi = vb[idx].transpose(0, 1)
            if meta.masks[i] is None:
                o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=self.scale, enable_gqa=True)
            else:
                o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=meta.masks[i], scale=self.scale, enable_gqa=True)
            out[s : s + n] = o.transpose(0, 1).reshape(n, H * D)
        return out
