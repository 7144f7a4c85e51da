"""Per-position recurrent states of a verification pass (hybrid models): what lets a rejected draft token leave
no trace in a request's state.

A verify step runs a request's last token and its k draft tokens (jump-forward's forced tokens, an n-gram
draft) in one forward pass. The linear-attention layers (model/layers/gated_deltanet.py) run those k + 1
tokens position by position with the decode rule, from the request's state slot, and keep here the state
(the DeltaNet matrix and the convolution window) after each position: scratch beside the state pool
(mem/state_pool.py), never one of its slots, alive for one step. Once the sampler knows how many draft tokens
the model accepted (model/executor/sample_step.py), `keep` sets the request's slot to the state after its last
kept position: its token and the accepted draft tokens, exactly what decoding them one by one leaves there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlang_runtime.mem.state_pool import StatePool

SCRATCH_BYTES = 256 << 20  # one request's per-position states in a verify step, at most (with its own position)


def draft_cap(pool: StatePool) -> int:
    """Draft tokens per request whose per-position states fit SCRATCH_BYTES (at least 1): a large model's
    state is tens of MiB, and a grammar may force 64 tokens at once."""
    return max(1, SCRATCH_BYTES // pool.shape.bytes_per_slot() - 1)


@dataclass(frozen=True)
class VerifyKeep:
    """What a verify step kept (request index -> draft tokens accepted): rank 0 sends it to the other
    tensor-parallel ranks after sampling, so each rolls its share of the states back the same way."""

    accepted: dict[int, int]


class VerifyStates:
    def __init__(self, pool: StatePool, requests: list[tuple[int, int, int]]):
        """requests: (request index in the step, its state slot, positions it verifies = k + 1)."""
        self.slot: dict[int, int] = {}
        self.first: dict[int, int] = {}  # request index -> its first scratch row (one row per position)
        self.count: dict[int, int] = {}
        rows = 0
        for i, slot, n in requests:
            self.slot[i], self.first[i], self.count[i] = slot, rows, n
            rows += n
        shape, dev = pool.shape, pool.ssm.device
        self.ssm = torch.empty((shape.layers, rows, *shape.ssm), dtype=torch.float32, device=dev)
        self.conv = torch.empty((shape.layers, rows, *shape.conv), dtype=shape.dtype, device=dev)

    def put(self, layer: int, rows: list[int], ssm: torch.Tensor, conv: torch.Tensor) -> None:
        """Layer `layer`'s states after one position of some requests (scratch rows `rows`)."""
        at = torch.tensor(rows, dtype=torch.int64, device=self.ssm.device)
        self.ssm[layer, at] = ssm
        self.conv[layer, at] = conv

    def keep(self, pool: StatePool, accepted: dict[int, int]) -> None:
        """Each verifying request's slot := the state after its token and its first accepted[i] draft tokens
        (every layer). A request missing from `accepted` kept none of its draft."""
        for i, slot in self.slot.items():
            a = accepted.get(i, 0)
            if not 0 <= a < self.count[i]:
                raise ValueError(f"request {i}: {a} draft tokens accepted of {self.count[i] - 1}")
            pool.ssm[:, slot] = self.ssm[:, self.first[i] + a]
            pool.conv[:, slot] = self.conv[:, self.first[i] + a]
