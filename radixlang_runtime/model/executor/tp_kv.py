"""TPRecordPort: KVRecordPort's records (mem/kv_records.py) over the K/V of every tensor-parallel rank, for PD.

Under tensor parallelism each rank's pool holds only its KV heads ([2, layers, kv_count, slots, head_dim],
parallel.Shard). The records PD moves are the whole model's, [2, layers, num_kv_heads, t, head_dim]: the
same bytes a tp_size 1 pool gives for the same K/V, so a prefill and a decode of any tp sizes exchange them
(the handshake's token_bytes still checks model and dtype). Rank 0 (the scheduler) does both sides:
- read: it broadcasts KVRead(slots); every rank index_selects its heads (padded to kv_count_max, so all
  ranks send equal shapes), rank 0 gathers them over the CPU group and places each rank's heads at its
  kv_start (a KV head replicated on several ranks is written once per replica, the same values);
- write: it broadcasts KVWrite(slots, payload) (the whole records); every rank keeps its heads' slice.
The workers (tp_worker.py) run `serve` on these between steps. Ordering is the group's one invariant
(parallel.py): rank 0 issues them on its scheduler thread between steps, so a read sees every earlier
step's K/V on every rank, and a write lands before any later step reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from radixlang_runtime.mem.kv_records import check_joined, check_records, pack_joined, pack_records, unpack_records
from radixlang_runtime.model.executor.parallel import head_split


@dataclass
class KVRead:
    """Rank 0 -> all: send the K/V heads of these slots (n * t of them) to rank 0 (TPGroup.gather_cpu)."""

    slots: list[int]


@dataclass
class KVWrite:
    """Rank 0 -> all: write these slots from `payload` (n whole records joined); each rank its own heads."""

    slots: list[int]
    payload: bytes
    n: int  # records


def _local_heads(runner: Any, slots: list[int]) -> torch.Tensor:
    """This rank's heads of `slots`: [2, layers, kv_count_max, len(slots), head_dim] on the CPU, as bytes
    (uint8, last dim head_dim * element size: gloo gathers any dtype so); heads past kv_count are zero."""
    block = runner.kv_pool.block
    kv = block.index_select(3, torch.tensor(slots, dtype=torch.int64, device=block.device)).cpu()
    pad = runner.shard.kv_count_max - kv.shape[2]
    if pad:
        kv = torch.cat([kv, kv.new_zeros(kv.shape[0], kv.shape[1], pad, *kv.shape[3:])], dim=2)
    return kv.contiguous().view(torch.uint8)


def _write_local(runner: Any, op: KVWrite, shape: tuple[int, ...]) -> None:
    block, sh = runner.kv_pool.block, runner.shard
    full = unpack_records(op.payload, op.n, shape, block.dtype)  # [2, L, H, n * t, D]
    mine = full[:, :, sh.kv_start:sh.kv_start + sh.kv_count].to(block.device)
    block.index_copy_(3, torch.tensor(op.slots, dtype=torch.int64, device=block.device), mine)


def record_shape(runner: Any, t: int) -> tuple[int, ...]:
    """One whole-model record: [2, layers, num_kv_heads, t, head_dim]."""
    cfg = runner.cfg
    return 2, cfg.num_hidden_layers, cfg.num_key_value_heads, t, cfg.head_dim


@torch.inference_mode()
def serve(runner: Any, op: Any) -> None:
    """A worker rank (> 0): its part of rank 0's KVRead / KVWrite (the records are one token each, as PD's)."""
    if isinstance(op, KVRead):
        runner.tp.gather_cpu(_local_heads(runner, op.slots))
    else:
        _write_local(runner, op, record_shape(runner, len(op.slots) // op.n))


class TPRecordPort:
    """KVRecordPort's interface (record_bytes, read_/write_records, read_/write_joined) on rank 0 of a TP group."""

    def __init__(self, runner: Any, record_tokens: int):
        if runner.cfg.mla is not None:  # every rank holds the whole latent entry: not a split of heads
            raise ValueError(f"PD disaggregation with tp_size {runner.tp.size} is not implemented for "
                             f"{runner.cfg.architecture} (multi-head latent attention): serve it with tp_size 1")
        if len(runner.kv_pool.groups) > 1:  # each rank's layer shapes are the family's own split of each layer
            raise ValueError(f"moving K/V records with tp_size {runner.tp.size} is not implemented for "
                             f"{runner.cfg.architecture}'s per-layer KV shapes: serve it with tp_size 1")
        self.runner, self.t, self.tp = runner, record_tokens, runner.tp
        self.shape = record_shape(runner, record_tokens)
        self.dtype = runner.kv_pool.block.dtype
        self.record_bytes = self.shape[0] * self.shape[1] * self.shape[2] * self.shape[3] * self.shape[4] * \
            runner.kv_pool.block.element_size()
        cfg = runner.cfg
        # (kv_start, kv_count) of every rank, in rank order
        self.heads = [head_split(cfg.num_attention_heads, cfg.num_key_value_heads, self.tp.size, r)[2:]
                      for r in range(self.tp.size)]

    def _gather(self, slots: list[int]) -> torch.Tensor:
        """Every rank's heads of `slots` -> [2, layers, num_kv_heads, len(slots), head_dim] on the CPU."""
        self.tp.broadcast_obj(KVRead(slots))
        parts = self.tp.gather_cpu(_local_heads(self.runner, slots))
        two, layers, heads, _, dim = self.shape
        full = torch.empty(two, layers, heads, len(slots), dim, dtype=self.dtype)
        for (start, count), part in zip(self.heads, parts):
            full[:, :, start:start + count] = part.view(self.dtype)[:, :, :count]
        return full

    @torch.inference_mode()
    def read_records(self, slots: list[int]) -> list[bytes]:
        """slots: n * record_tokens slots -> n payloads of every rank's heads."""
        return pack_records(self._gather(list(slots)), self.t)

    @torch.inference_mode()
    def read_joined(self, slots: list[int]) -> bytes:
        return pack_joined(self._gather(list(slots)), self.t)

    def write_records(self, slots: list[int], payloads: list[bytes]) -> None:
        check_records(slots, payloads, self.t, self.record_bytes)
        self.write_joined(slots, b"".join(payloads))

    @torch.inference_mode()
    def write_joined(self, slots: list[int], data: bytes) -> None:
        """Refused on rank 0 (ValueError) before anything is broadcast when data is not whole records."""
        data = bytes(data)  # a received chunk's memoryview (disagg/link.py) is not picklable for the broadcast
        op = KVWrite(list(slots), data, check_joined(slots, data, self.t, self.record_bytes))
        self.tp.broadcast_obj(op)
        _write_local(self.runner, op, self.shape)
