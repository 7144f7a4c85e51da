"""RecurrentSpec: what every hybrid model's recurrent layers share, whatever their kind: which layers keep a
recurrent state instead of K/V, and the two tensors that state is per layer and request (a float32 matrix per
head and the causal convolution's window). The state pool (mem/state_pool.py), its snapshots, the verify
scratch and the runner read only this; a kind's own spec adds its sizes:
linear_attn_spec.LinearAttnSpec (Gated DeltaNet), mamba2_spec.Mamba2Spec (Mamba2).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RecurrentSpec:
    linear_layers: tuple[bool, ...]  # per layer: a recurrent layer (True) or attention over the KV pool (False)

    @property
    def num_linear(self) -> int:
        return sum(self.linear_layers)

    def index_of(self, layer: int) -> int:
        """Layer `layer`'s index among the recurrent layers (its state's index in the state pool)."""
        return sum(self.linear_layers[:layer])

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """One layer's state of one request: the matrix per head (float32) and the conv window [C, K - 1]."""
        raise NotImplementedError

    def split(self, size: int) -> "RecurrentSpec":
        """One rank's share with tensor parallelism over `size` ranks; ValueError where it does not split."""
        raise NotImplementedError
