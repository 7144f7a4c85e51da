"""Tensor parallelism on torch.distributed: how the model is split over ranks, and the group's collectives.

The split is Megatron's (as in SGLang and vLLM): q/k/v and gate/up are column-parallel (each rank
computes its heads / its slice of the intermediate size), o and down are row-parallel (each rank
multiplies its input slice; an all-reduce sums the partial outputs), the embedding and the output head
are vocab-parallel (embedding: a masked lookup of the rank's rows + all-reduce; head: each rank its
vocab rows, logits gathered on rank 0, the only rank that samples).

Heads are split in whole GQA groups, so every q head of a rank reads a KV head of the same rank:
with Hkv >= tp the KV heads (and their groups) are split as evenly as possible, ranks may differ by
one group (SmolLM2's 9 q / 3 KV heads over 2 ranks: 6 q + 2 KV and 3 q + 1 KV); with Hkv < tp each
KV head is replicated on tp / Hkv ranks that split its group's q heads (tp must be a multiple of Hkv
and the group a multiple of tp / Hkv).

Who decides: rank 0 runs the one scheduler and broadcasts each step's inputs (runner.StepInputs)
before the forward; the other ranks only run the model on what they receive. SGLang instead runs an
identical scheduler on every rank; here grammar compilation finishes asynchronously in worker
processes and prefix pins expire on the clock, so identical schedulers could diverge, while the
broadcast of one step's ids and slots (a few KB) costs well under a millisecond over gloo.

Invariants:
- every rank issues the same collectives in the same order: one broadcast per step (or keepalive),
  then the model's all-reduces, then one gather of the logits;
- a failed collective (a rank died, a timeout) raises ParallelFault and marks the group broken: the
  process cannot continue and must exit (the server then reports unhealthy and stops);
- an idle rank 0 broadcasts a keepalive at least every KEEPALIVE_S, so the other ranks' waits stay
  within the group's timeout and a dead rank is noticed within about a second.
"""

from __future__ import annotations

import datetime
import logging
import pickle
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from radixlang_runtime.utils.faults import FatalFault

logger = logging.getLogger(__name__)

Reduce = Optional[Callable[[torch.Tensor], torch.Tensor]]  # in-place sum over the TP ranks

KEEPALIVE_S = 0.5
STOP = "stop"  # rank 0 -> workers: shut down


class ParallelFault(FatalFault):
    """A collective failed: a rank is gone or timed out. The tensor-parallel group is unusable."""


def split_even(n: int, parts: int, i: int) -> tuple[int, int]:
    """Part i of n items in `parts` contiguous parts, the first n % parts one larger: (start, count)."""
    base, extra = divmod(n, parts)
    return i * base + min(i, extra), base + (1 if i < extra else 0)


@dataclass(frozen=True)
class Shard:
    """This rank's part of the model. tp size 1: everything."""

    rank: int
    size: int
    q_start: int  # q heads [q_start, q_start + q_count)
    q_count: int
    kv_start: int  # KV heads [kv_start, kv_start + kv_count)
    kv_count: int
    kv_count_max: int  # the largest kv_count of any rank: every rank sizes its KV pool with it
    inter_start: int  # MLP intermediate columns [inter_start, inter_start + inter_count)
    inter_count: int
    vocab_start: int  # vocab rows [vocab_start, vocab_start + vocab_count)
    vocab_count: int
    vocab_padded: int  # ceil(V / size): the rows per rank in the gathered logits (the last rank padded)


def head_split(num_heads: int, num_kv_heads: int, size: int, rank: int) -> tuple[int, int, int, int]:
    """(q_start, q_count, kv_start, kv_count) of `rank`, in whole GQA groups (see the module docstring)."""
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} attention heads are not a multiple of {num_kv_heads} KV heads")
    group = num_heads // num_kv_heads
    if num_kv_heads >= size:
        kv_start, kv_count = split_even(num_kv_heads, size, rank)
        return kv_start * group, kv_count * group, kv_start, kv_count
    reps = size // num_kv_heads
    if size % num_kv_heads or group % reps:
        raise ValueError(f"tp_size {size} cannot split {num_heads} q / {num_kv_heads} KV heads: with fewer KV "
                         f"heads than ranks, tp_size must be a multiple of the KV heads and divide each group")
    kv = rank // reps
    q_count = group // reps
    return kv * group + (rank % reps) * q_count, q_count, kv, 1


def make_shard(num_heads: int, num_kv_heads: int, intermediate_size: int, vocab_size: int,
               size: int = 1, rank: int = 0) -> Shard:
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} outside a group of {size}")
    q_start, q_count, kv_start, kv_count = head_split(num_heads, num_kv_heads, size, rank)
    kv_max = max(head_split(num_heads, num_kv_heads, size, r)[3] for r in range(size))
    if intermediate_size < size:
        raise ValueError(f"tp_size {size} exceeds the MLP's intermediate size {intermediate_size}")
    inter_start, inter_count = split_even(intermediate_size, size, rank)
    vp = -(-vocab_size // size)
    v0 = rank * vp
    vc = min(vp, vocab_size - v0)
    if vc <= 0:
        raise ValueError(f"tp_size {size} leaves rank {rank} no vocabulary rows (vocab {vocab_size})")
    return Shard(rank, size, q_start, q_count, kv_start, kv_count, kv_max, inter_start, inter_count, v0, vc, vp)


def parse_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"dist_init_addr must be host:port; got {addr!r}")
    return host, int(port)


class TPGroup:
    """One rank's membership of a tensor-parallel group: a TCPStore rendezvous at init_addr (rank 0
    hosts it), gloo for CPU tensors and objects, NCCL for CUDA tensors."""

    def __init__(self, rank: int, size: int, init_addr: str, timeout_s: float, device: torch.device,
                 rendezvous_timeout_s: float = 1800.0):
        import torch.distributed as dist

        self.rank, self.size, self.device = rank, size, device
        self.timeout = datetime.timedelta(seconds=timeout_s)
        host, port = parse_addr(init_addr)
        self.store = dist.TCPStore(host, port, size, rank == 0,
                                   timeout=datetime.timedelta(seconds=rendezvous_timeout_s))
        self.cpu_pg = dist.ProcessGroupGloo(self.store, rank, size, self.timeout)  # objects, CPU tensors
        self.pg = self.cpu_pg
        if device.type == "cuda":
            self.pg = dist.ProcessGroupNCCL(self.store, rank, size)
        self.broken: Optional[str] = None
        self._last_broadcast = time.monotonic()
        self._rendezvous_timeout = datetime.timedelta(seconds=rendezvous_timeout_s)

    # ------------------------------------------------------------------ start-up
    def wait_all_loaded(self, peers_alive: Optional[Callable[[], bool]] = None) -> None:
        """Barrier through the store (not a collective: model loading may take longer than the
        group's timeout): returns once every rank has loaded its shard. `peers_alive` (where this
        process can see the other ranks' processes) is polled every second: a rank that died while
        loading is an error at once, not after the rendezvous timeout."""
        self.store.set(f"loaded/{self.rank}", "1")
        keys = [f"loaded/{r}" for r in range(self.size)]
        deadline = time.monotonic() + self._rendezvous_timeout.total_seconds()
        while not self.store.check(keys):  # polled (a blocking wait logs a warning at every timeout)
            if peers_alive is not None and not peers_alive():
                raise RuntimeError("a tensor-parallel rank exited while loading its shard")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensor-parallel ranks not loaded after {self._rendezvous_timeout}")
            time.sleep(0.1)
        self._last_broadcast = time.monotonic()

    # ------------------------------------------------------------------ collectives
    def _wait(self, work: Any, what: str) -> None:
        if self.broken:
            raise ParallelFault(self.broken)
        try:
            work.wait()
        except RuntimeError as e:
            self.broken = f"tensor-parallel {what} failed on rank {self.rank}: {e}"
            raise ParallelFault(self.broken) from e

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place; returns x."""
        self._wait(self.pg.allreduce([x]), "all-reduce")
        return x

    def gather_logits(self, local: torch.Tensor, shard: Shard, vocab_size: int) -> Optional[torch.Tensor]:
        """local [R, vocab_count] -> [R, V] on rank 0 (None elsewhere); the last rank's rows padded."""
        import torch.distributed as dist

        R = local.shape[0]
        if local.shape[1] < shard.vocab_padded:
            local = torch.cat([local, local.new_zeros(R, shard.vocab_padded - local.shape[1])], dim=1)
        local = local.contiguous()
        opts = dist.GatherOptions()
        opts.rootRank = 0
        outs = [[torch.empty_like(local) for _ in range(self.size)]] if self.rank == 0 else []
        self._wait(self.pg.gather(outs, [local], opts), "gather")
        if self.rank != 0:
            return None
        return torch.cat(outs[0], dim=1)[:, :vocab_size]

    def gather_cpu(self, local: torch.Tensor) -> Optional[list[torch.Tensor]]:
        """local: a CPU tensor of the same shape and dtype on every rank -> every rank's, in rank order, on
        rank 0 (None elsewhere). Over the CPU group (gloo) on any device."""
        import torch.distributed as dist

        local = local.contiguous()
        opts = dist.GatherOptions()
        opts.rootRank = 0
        outs = [[torch.empty_like(local) for _ in range(self.size)]] if self.rank == 0 else []
        self._wait(self.cpu_pg.gather(outs, [local], opts), "gather")
        return outs[0] if self.rank == 0 else None

    def broadcast_obj(self, obj: Any) -> None:
        """Rank 0: send obj (pickled) to every rank."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self._wait(self.cpu_pg.broadcast(torch.tensor([len(data)], dtype=torch.int64), 0), "broadcast")
        self._wait(self.cpu_pg.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), 0), "broadcast")
        self._last_broadcast = time.monotonic()

    def recv_obj(self) -> Any:
        """Ranks > 0: the next object rank 0 broadcast."""
        n = torch.zeros(1, dtype=torch.int64)
        self._wait(self.cpu_pg.broadcast(n, 0), "broadcast")
        buf = torch.empty(int(n.item()), dtype=torch.uint8)
        self._wait(self.cpu_pg.broadcast(buf, 0), "broadcast")
        return pickle.loads(buf.numpy().tobytes())

    def keepalive(self) -> None:
        """Rank 0, between steps: a keepalive if nothing went out for KEEPALIVE_S (also how a dead
        rank is noticed while idle)."""
        if self.rank == 0 and time.monotonic() - self._last_broadcast >= KEEPALIVE_S:
            self.broadcast_obj(None)

    def close(self) -> None:
        """Rank 0: tell the other ranks to exit (best effort: they may be gone already)."""
        if self.rank == 0 and not self.broken:
            try:
                self.broadcast_obj(STOP)
            except ParallelFault:
                pass
