"""MLASpec: multi-head latent attention's geometry (DeepSeek V2 / V3, Kimi K2), parsed once (no torch).

A token's KV-pool entry under MLA is what the model caches: the compressed latent (kv_lora_rank lanes, after
kv_a_layernorm) then the roped key part shared by every head (qk_rope_head_dim lanes): one "head" of
kv_lora_rank + qk_rope_head_dim. The values are the latent itself (V is a view of the entry's first
kv_lora_rank lanes, no second copy), so the pool holds one buffer per layer (mem/kv_pool.py's latent layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class MLASpec:
    q_lora_rank: Optional[int]  # None: q_proj straight from the hidden state; else q_a_proj -> norm -> q_b_proj
    kv_lora_rank: int  # the latent's width C
    qk_nope_head_dim: int  # per head: the key / query lanes without position
    qk_rope_head_dim: int  # R: the roped lanes (one key part for all heads)
    v_head_dim: int  # per head: the value lanes after kv_b_proj
    softmax_scale: float  # qk_head_dim ** -0.5, times YaRN's mscale(factor, mscale_all_dim) ** 2
    rope_interleave: bool  # rotate adjacent pairs (x0, x1), (x2, x3).. (V2 always, V3 by default), else halves

    @property
    def entry_dim(self) -> int:
        """Lanes of one token's pool entry: the latent then the roped key."""
        return self.kv_lora_rank + self.qk_rope_head_dim
