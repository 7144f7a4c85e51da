"""Attention backends behind one registry; imports are lazy so a missing Triton costs nothing."""

from __future__ import annotations

from radixlang_runtime.model.layers.attention.base import AttentionBackend


def create_attention_backend(name: str, num_heads: int, num_kv_heads: int, head_dim: int,
                             scale: float) -> AttentionBackend:
    if name == "torch":
        from radixlang_runtime.model.layers.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend(num_heads, num_kv_heads, head_dim, scale)
    if name == "triton":
        try:
            from radixlang_runtime.model.layers.attention.triton_backend import TritonAttentionBackend
        except ImportError as e:
            raise ValueError(f"attention backend 'triton' needs the triton package ({e})") from None
        return TritonAttentionBackend(num_heads, num_kv_heads, head_dim, scale)
    raise ValueError(f"unknown attention backend {name!r}; choose torch or triton")
