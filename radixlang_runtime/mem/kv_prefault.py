"""Pages of the lazily mapped CPU KV pool faulted in ahead of the allocator, on a background thread.

The large CPU pool is an anonymous mmap whose pages cost resident memory only once written
(mem/kv_memory.py). The first write to each 4 KiB page is a page fault, paid by whoever writes: a
prefill storing K/V, or a PD decode server writing a received transfer into fresh slots between two
decode steps (docs/PERFORMANCE.md, "PD: a transfer spread over the decode's steps"). Fresh slots come
in order: the allocator reuses freed pages first and takes new ones in ascending page order, so the
slots ever handed out are [0, frontier) with `frontier = allocator.touched_pages * page_size`.

KVPrefaulter keeps the pool's pages for slots [0, min(num_slots, frontier + ahead)) resident, by
madvise(MADV_POPULATE_WRITE) over each (K/V, layer, head) plane's byte range of those slots: the pages
are faulted in writable, their contents unchanged (a page already present, written by the scheduler a
moment ago, is left as it is: the thread never writes the pool). Resident memory therefore stays what is
used plus `ahead` slots' worth.

The thread runs at the lowest CPU priority (nice 19), one madvise call at a time (one plane's slots of
the current window, PACE_S apart), and holds the pool only weakly between calls: it ends when the pool
is gone, when close() is called, or when the kernel refuses the advice (Linux < 5.14, other systems:
the pool then faults lazily as before, nothing else changes).
Every wait is bounded (POLL_S; close joins for <= 2 s).

Block layout: [2, layers, kv_heads, num_slots, head_dim], contiguous (mem/kv_pool.py); a pool of several entry
shapes has one such block per group, and its planes are every block's.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import weakref
from typing import Callable, Sequence, Union

import torch

from radixlang_kernels import libc

logger = logging.getLogger(__name__)
MADV_POPULATE_WRITE = 23  # linux/mman.h (5.14+)
AHEAD_BYTES = 128 << 20  # pool bytes kept resident past the allocator's frontier
CALL_BYTES = 256 << 10  # bytes of one plane populated per madvise call (a short burst of page faults)
PACE_S = 0.004  # pause after each call: the faults' cost lands on the core's other threads in small slices
POLL_S = 0.02  # how often an idle thread reads the frontier

def populate(block: torch.Tensor, plane: int, first: int, last: int) -> bool:
    """Fault in (writable, contents unchanged) the pages of slots [first, last) of one plane (K/V, layer, head)
    of block [2, L, H, S, D]. False when the kernel refuses (the caller stops trying)."""
    if not libc.madvise_available():
        return False
    s, d = block.shape[3], block.shape[4]
    per_slot = d * block.element_size()
    lo = block.data_ptr() + (plane * s + first) * per_slot
    hi = block.data_ptr() + (plane * s + last) * per_slot
    lo -= lo % mmap.PAGESIZE
    err = libc.madvise(lo, hi - lo, MADV_POPULATE_WRITE) if hi > lo else 0
    if err:
        logger.info("KV prefault off: madvise(MADV_POPULATE_WRITE) failed (%s)", os.strerror(err))
        return False
    return True


class KVPrefaulter:
    """Keeps slots [0, frontier() + ahead_slots) of block resident (see the module docstring), window_slots
    slots at a time: one madvise call per plane of the window, PACE_S after each call."""

    def __init__(self, block: Union[torch.Tensor, Sequence[torch.Tensor]], frontier: Callable[[], int],
                 ahead_slots: int, window_slots: int):
        blocks = [block] if isinstance(block, torch.Tensor) else list(block)  # a pool's group blocks
        for b in blocks:
            assert b.dim() == 5 and b.is_contiguous() and b.device.type == "cpu", tuple(b.shape)
        self.num_slots = blocks[0].shape[3]
        # (block, plane) of every plane: 2 * layers * kv_heads per block
        self._planes = [(i, p) for i, b in enumerate(blocks) for p in range(b.numel() // (b.shape[3] * b.shape[4]))]
        self.planes = len(self._planes)
        self._blocks = [weakref.ref(b) for b in blocks]  # the pool may go away under the thread: it then ends
        self.frontier, self.ahead_slots, self.window_slots = frontier, ahead_slots, max(1, window_slots)
        self.done = 0  # slots [0, done) are resident in every plane (this thread writes it, others may read)
        self._last = 0  # the window in progress is slots [done, _last); planes [0, _plane) of it are done
        self._plane = 0
        self.off = False  # the kernel refused, or the pool is gone: nothing more is tried
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="KVPrefaulter", daemon=True)

    @classmethod
    def for_pool(cls, blocks: Sequence[torch.Tensor], frontier: Callable[[], int]) -> "KVPrefaulter":
        """blocks: the pool's group blocks (one for a pool of one entry shape)."""
        all_planes = sum(b.numel() // b.shape[3] * b.element_size() for b in blocks)  # bytes a slot takes
        one_plane = max(b.shape[4] * b.element_size() for b in blocks)
        return cls(blocks, frontier, AHEAD_BYTES // all_planes, CALL_BYTES // one_plane)

    def start(self) -> "KVPrefaulter":
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)

    def target(self) -> int:
        return min(self.num_slots, self.frontier() + self.ahead_slots)

    def step(self) -> bool:
        """One madvise call (one plane of the window); False when there is nothing to do or nothing more can be."""
        if self.off or self.done >= self.num_slots:
            return False
        if self._last <= self.done:  # open the next window
            last = min(self.target(), self.done + self.window_slots)
            if last <= self.done:
                return False
            self._last, self._plane = last, 0
        which, plane = self._planes[self._plane]
        block = self._blocks[which]()
        if block is None or not populate(block, plane, self.done, self._last):
            self.off = True
            return False
        del block
        self._plane += 1
        if self._plane == self.planes:
            self.done = self._last
        return True

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # Linux: per-thread nice
        except (AttributeError, OSError):
            pass
        while not self._stop.is_set() and not self.off and self.done < self.num_slots:
            self._stop.wait(PACE_S if self.step() else POLL_S)
