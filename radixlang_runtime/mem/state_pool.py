"""State pool: the recurrent state of hybrid models' recurrent layers (model/layers/gated_deltanet.py, mamba2.py),
beside the KV pool. Per state slot and per recurrent layer: the state matrix (the DeltaNet's [Hv, Dk, Dv],
Mamba2's [heads, head_dim, d_state]; float32) and the convolution window [conv_dim, K - 1] (the model dtype).

Slot s < rows is the state of the request in request-table row s: a row is allocated and freed with its
request (admission; finish, abort, retraction: scheduler/kv_manager.KVManager.release), so the state follows
the same life and the same integrity check as the rows. The slots after them hold the prefix cache's state
snapshots (mem/state_slots.py, scheduler/state_cache.py). A request's first step starts from zeros (the
runner reads zeros when its prefix length is 0) or from a snapshot copied in, so a freed slot needs no
clearing, and a retracted request recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StateShape:
    """What one slot holds: `layers` linear layers of ssm [Hv, Dk, Dv] float32 and conv [C, K - 1] in dtype."""

    layers: int
    ssm: tuple[int, ...]
    conv: tuple[int, ...]
    dtype: torch.dtype

    def bytes_per_slot(self) -> int:
        conv = torch.empty((), dtype=self.dtype).element_size()
        return self.layers * (4 * _numel(self.ssm) + conv * _numel(self.conv))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class StatePool:
    def __init__(self, num_slots: int, shape: StateShape, device: torch.device):
        self.num_slots = num_slots
        self.shape = shape
        # ssm[l] [slots, Hv, Dk, Dv]; conv[l] [slots, C, K - 1]: layer l's views, indexed by slot
        self.ssm = torch.zeros((shape.layers, num_slots, *shape.ssm), dtype=torch.float32, device=device)
        self.conv = torch.zeros((shape.layers, num_slots, *shape.conv), dtype=shape.dtype, device=device)
        self.nbytes = num_slots * shape.bytes_per_slot()

    def copy(self, src: int, dst: int) -> None:
        """Slot dst's state (every layer) := slot src's."""
        self.ssm[:, dst] = self.ssm[:, src]
        self.conv[:, dst] = self.conv[:, src]

    def clear(self, slot: int) -> None:
        self.ssm[:, slot] = 0
        self.conv[:, slot] = 0

    def info(self, slots_in_use: int) -> dict:
        """For /server_info: the pool's size and use."""
        return {"state_slots": self.num_slots, "request_slots_in_use": slots_in_use,
                "state_bytes_per_slot": self.shape.bytes_per_slot(), "state_pool_bytes": self.nbytes,
                "linear_layers": self.shape.layers}
