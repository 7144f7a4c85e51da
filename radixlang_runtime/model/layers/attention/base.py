"""The attention-backend contract. Backends register in `attention/__init__.py` and are chosen
by `--attention-backend`; the model calls `forward` once per layer and never sees paging."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

import torch

from radixlang_runtime.model.executor.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    supports_sinks = False  # a backend whose every path honours attention sinks (set_sinks) says True
    supports_chunks = False  # whether this backend implements chunked local attention (set_layer_chunks)

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        # per layer: sliding window w > 0 (the query at position p sees keys at (p - w, p], transformers'
        # sliding_window) or 0 (full causal); layers past the tuple's end are full. Set by set_layer_options.
        self.windows: tuple[int, ...] = ()
        self.soft_cap = 0.0  # c > 0: scores become c * tanh(scores / c) (Gemma 2), every layer
        # per layer: chunked local attention c > 0 (Llama 4: the query at position p sees keys at [p - p % c, p])
        # or 0; layers past the tuple's end are not chunked. Set by set_layer_chunks.
        self.chunks: tuple[int, ...] = ()
        # layer -> [H] float attention sinks (gpt-oss: a learned logit per query head that joins every row's
        # softmax denominator and weighs no value); layers absent have none. Set by set_sinks.
        self.sinks: dict[int, torch.Tensor] = {}
        # per layer (kv_heads, head_dim) where layers differ (Gemma 4; then head_dim is the widest); None: every
        # layer (num_kv_heads, head_dim). Set by set_layer_shapes.
        self.layer_shapes: Optional[tuple[tuple[int, int], ...]] = None
        self.prior_dim = head_dim  # the head_dim of the layers cascade attention runs on (its prior's width)

    def set_layer_options(self, windows: tuple[int, ...], soft_cap: float = 0.0) -> None:
        """The model's per-layer windows and attention logit soft-cap (ModelConfig.layer_windows)."""
        self.windows = tuple(int(w) for w in windows)
        self.soft_cap = float(soft_cap or 0.0)

    def set_layer_chunks(self, chunks: tuple[int, ...]) -> None:
        """The model's per-layer attention chunks (ModelConfig.layer_chunks); a backend that does not implement
        them refuses by name."""
        chunks = tuple(int(c) for c in chunks)
        if any(chunks) and not self.supports_chunks:
            raise ValueError(f"the {type(self).__name__} attention backend does not implement chunked local "
                             f"attention (attention_chunk_size {max(chunks)}): use --attention-backend torch")
        self.chunks = chunks

    def chunk(self, layer: int) -> int:
        return self.chunks[layer] if layer < len(self.chunks) else 0

    @property
    def distinct_chunks(self) -> set[int]:
        """The chunk sizes > 0 some layer applies (metadata is built once per step for each)."""
        return {c for c in self.chunks if c > 0}

    def set_sinks(self, layer: int, sinks: torch.Tensor) -> None:
        """Layer `layer`'s sinks [H] (this rank's query heads); ValueError where the backend has no sinks."""
        if not self.supports_sinks:
            raise ValueError(f"attention sinks are not supported by the {type(self).__name__} (serve this model "
                             "with --attention-backend torch)")
        if sinks.shape != (self.num_heads,):
            raise ValueError(f"attention sinks of layer {layer}: expected shape ({self.num_heads},), "
                             f"got {tuple(sinks.shape)}")
        self.sinks[layer] = sinks

    def set_layer_shapes(self, shapes: tuple[tuple[int, int], ...]) -> None:
        """The model's (kv_heads, head_dim) of each layer the backend attends (this rank's heads; q heads stay
        num_heads), where layers differ."""
        self.layer_shapes = tuple((int(h), int(d)) for h, d in shapes)
        self.prior_dim = min(self.cascade_dims(), default=self.head_dim)

    def cascade_dims(self, skip: frozenset = frozenset()) -> set[int]:
        """The head_dims of the layers (but `skip`) cascade attention may run on: neither windowed nor chunked.
        More than one: the backend runs no cascade (one shared-prefix output per step)."""
        if self.layer_shapes is None:
            return {self.head_dim}
        return {d for i, (_, d) in enumerate(self.layer_shapes)
                if i not in skip and not self.window(i) and not self.chunk(i)}

    def window(self, layer: int) -> int:
        return self.windows[layer] if layer < len(self.windows) else 0

    @property
    def distinct_windows(self) -> set[int]:
        """The windows > 0 some layer applies (metadata is built once per step for each)."""
        return {w for w in self.windows if w > 0}

    @abstractmethod
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        """Once per step, before the layers: precompute index tensors into `fb.attn_meta`."""

    @abstractmethod
    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                       fb: ForwardBatch) -> torch.Tensor:
        """Causal attention of each request's new tokens over its prefix (in the pool) + themselves.

        Args: q [T, H, D]; k, v [T, Hkv, D] of the new tokens, already stored at fb.out_loc.
        Returns: [T, H * D].
        """

    @abstractmethod
    def forward_decode(self, q: torch.Tensor, layer: int, fb: ForwardBatch) -> torch.Tensor:
        """One new token per request over its whole sequence. q [B, H, D] -> [B, H * D]."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, fb: ForwardBatch) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D]: stores k/v into the pool, then attends."""
        fb.kv_pool.store(layer, fb.out_loc, k, v)
        return self.attend(q, k, v, layer, fb)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, fb: ForwardBatch) -> torch.Tensor:
        """`forward` after the store: k/v are already in the pool at fb.out_loc (cpu_ops.rope_store)."""
        if fb.is_decode:
            return self.forward_decode(q, layer, fb)
        return self.forward_extend(q, k, v, layer, fb)
