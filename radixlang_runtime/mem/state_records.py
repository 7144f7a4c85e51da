"""StateRecordPort: one state slot of a hybrid model's state pool (mem/state_pool.py) <-> payload bytes, for the
hierarchical cache's tiers (a radix node's snapshot goes with its K/V: mem/hicache.py) and PD (a prefilled
request's final state goes with its K/V records: disagg/).

A payload is the slot's DeltaNet matrices of every linear layer ([layers, Hv, Dk, Dv] float32) followed by its
convolution windows ([layers, C, K - 1] in the model dtype), contiguous, as raw bytes: StateShape.bytes_per_slot().
"""

from __future__ import annotations

import warnings

import torch

from radixlang_runtime.mem.state_pool import StatePool


class StateRecordPort:
    def __init__(self, pool: StatePool):
        self.pool = pool
        self.state_bytes = pool.shape.bytes_per_slot()
        self._ssm_bytes = 4 * pool.ssm[:, 0].numel()

    def read_state(self, slot: int) -> bytes:
        ssm = self.pool.ssm[:, slot].contiguous().cpu().view(torch.uint8)
        conv = self.pool.conv[:, slot].contiguous().cpu().view(torch.uint8)
        return ssm.numpy().tobytes() + conv.numpy().tobytes()

    def write_state(self, slot: int, payload: bytes) -> None:
        """Slot `slot` <- payload (ValueError, the slot untouched, when it is not one state of this pool's shape)."""
        if len(payload) != self.state_bytes:
            raise ValueError(f"a state payload of {len(payload)} bytes; this model's states hold {self.state_bytes}")
        with warnings.catch_warnings():  # bytes are not writable: nothing writes these views
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.frombuffer(payload, dtype=torch.uint8)
        ssm, conv = self.pool.ssm, self.pool.conv
        ssm[:, slot].copy_(raw[:self._ssm_bytes].view(torch.float32).view(ssm[:, slot].shape))
        conv[:, slot].copy_(raw[self._ssm_bytes:].view(conv.dtype).view(conv[:, slot].shape))
