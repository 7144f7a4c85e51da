"""The plain softmax attention of hybrid decoders (Granite 4.0-H, Nemotron-H) whose attention layers take KV-pool
planes of their own numbering (the recurrent and feed-forward-only layers take none): q / k / v fused in one
matmul, rope or no positions, o_proj. One rank (the Mamba2 layers beside it refuse tensor parallelism)."""

from __future__ import annotations

import torch
from torch import nn

from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.executor.parallel import Shard
from radixlang_runtime.model.layers.attention.base import AttentionBackend
from radixlang_runtime.model.layers.rotary import Rotary
from radixlang_runtime.model.loader.config import ModelConfig


class HybridAttention(nn.Module):
    """Softmax attention over the paged KV pool: fused q/k/v (attention_bias on them and o_proj), rope or none,
    o_proj; the backend scales the scores (ModelConfig.attn_scale, or head_dim ** -0.5)."""

    def __init__(self, cfg: ModelConfig, kv_layer: int, backend: AttentionBackend, shard: Shard, rope: bool):
        super().__init__()
        self.kv_layer = kv_layer  # this layer's index in the KV pool (attention layers only)
        self.h, self.hkv, self.d = shard.q_count, shard.kv_count, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.h + 2 * self.hkv) * self.d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=cfg.attention_bias)
        self.backend, self.rope = backend, rope

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        T, h, hkv, d = x.shape[0], self.h, self.hkv, self.d
        qkv = self.qkv_proj(x)
        qk = qkv[:, : (h + hkv) * d].view(T, h + hkv, d)
        v = qkv[:, (h + hkv) * d:].view(T, hkv, d)
        if self.rope:
            qk = Rotary.apply(qk, fb.rope_cos_sin)
        return self.o_proj(self.backend.forward(qk[:, :h], qk[:, h:], v.contiguous(), self.kv_layer, fb))
