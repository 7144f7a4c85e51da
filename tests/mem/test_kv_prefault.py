"""The KV pool's prefaulter (mem/kv_prefault.py): pages of the lazily mapped pool become resident ahead of the
allocator's frontier, contents untouched, and the thread ends with the pool or at close()."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import mmap
import time

import pytest
import torch

from radixlang_runtime.mem.allocator import PageAllocator
from radixlang_runtime.mem.kv_memory import LAZY_BYTES, kv_block
from radixlang_runtime.mem.kv_pool import KVPool
from radixlang_runtime.mem.kv_prefault import AHEAD_BYTES, KVPrefaulter, populate
from radixlang_runtime.wiring import start_kv_prefault

SHAPE = (2, 2, 2, 65536, 64)  # 8 planes of 65,536 slots x 64 bf16: 64 MiB, lazily mapped
PAGE = mmap.PAGESIZE

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_NOHUGEPAGE = mmap.MADV_NOHUGEPAGE  # page-granular residency, whatever the machine's transparent-hugepage setting


def resident(block: torch.Tensor, plane: int, first: int, last: int) -> list[bool]:
    """mincore over the whole pages inside slots [first, last) of one plane."""
    per_slot = block.shape[4] * block.element_size()
    lo = block.data_ptr() + (plane * block.shape[3] + first) * per_slot
    hi = block.data_ptr() + (plane * block.shape[3] + last) * per_slot
    lo += -lo % PAGE
    hi -= hi % PAGE
    n = (hi - lo) // PAGE
    vec = (ctypes.c_ubyte * n)()
    assert _libc.mincore(lo, hi - lo, vec) == 0, ctypes.get_errno()
    return [bool(v & 1) for v in vec]


def new_block() -> torch.Tensor:
    b = kv_block(SHAPE, torch.bfloat16, torch.device("cpu"))
    assert b.numel() * b.element_size() >= LAZY_BYTES
    assert _libc.madvise(b.data_ptr(), b.numel() * b.element_size(), MADV_NOHUGEPAGE) == 0
    return b


@pytest.fixture
def block():
    return new_block()


def test_populate_makes_pages_resident_and_leaves_contents(block):
    planes = SHAPE[0] * SHAPE[1] * SHAPE[2]
    data = torch.randn(planes, 100, 64).to(torch.bfloat16)
    view = block.view(planes, SHAPE[3], 64)
    view[:, 1000:1100] = data  # written before: those pages are resident already
    assert not any(resident(block, 3, 4096, 8192))
    for p in range(planes):
        assert populate(block, p, 0, 8192)
    assert all(resident(block, 3, 0, 8192))
    assert not any(resident(block, 3, 8192 + 64, 16384))  # only what was asked (a page of slack at the edge)
    assert torch.equal(view[:, 1000:1100], data)
    assert not view[:, :1000].any() and not view[:, 1100:8192].any()


def test_steps_follow_the_frontier_window_by_window(block):
    frontier = [0]
    pf = KVPrefaulter(block, lambda: frontier[0], ahead_slots=3000, window_slots=1024)
    steps = 0
    while pf.step():
        steps += 1
    assert pf.done == 3000 and steps == 3 * pf.planes  # windows of 1024, 1024, 952 slots, one call a plane each
    assert all(resident(block, pf.planes - 1, 0, 3000 - 64))
    assert not any(resident(block, 0, 3000 + 64, 6000))
    assert not pf.step()  # nothing to do until the frontier moves
    frontier[0] = 5000
    while pf.step():
        pass
    assert pf.done == 8000 and all(resident(block, 0, 3000, 8000 - 64))
    frontier[0] = SHAPE[3]
    while pf.step():
        pass
    assert pf.done == SHAPE[3]


def test_thread_runs_ahead_and_ends_with_the_pool():
    block = new_block()  # not a fixture: pytest would hold it
    pf = KVPrefaulter(block, lambda: 0, ahead_slots=2048, window_slots=512).start()
    deadline = time.monotonic() + 10
    while pf.done < 2048:
        assert time.monotonic() < deadline, pf.done
        time.sleep(0.01)
    assert all(resident(block, 7, 0, 2048 - 64))
    assert pf._thread.is_alive()
    del block
    gc.collect()
    pf.frontier = lambda: 10_000  # work to do: the thread finds the pool gone
    deadline = time.monotonic() + 10
    while pf._thread.is_alive():
        assert time.monotonic() < deadline, "the prefaulter outlived its pool"
        time.sleep(0.01)
    assert pf.off


def test_close_stops_the_thread(block):
    pf = KVPrefaulter(block, lambda: 0, ahead_slots=16, window_slots=16).start()
    pf.close()
    assert not pf._thread.is_alive()


def test_wiring_starts_one_for_a_lazy_pool_only():
    alloc = PageAllocator(65536, 16)
    big = KVPool(65536, 2, 2, 64, torch.bfloat16, torch.device("cpu"), 4, 128)
    small = KVPool(1024, 2, 2, 64, torch.bfloat16, torch.device("cpu"), 4, 128)
    start_kv_prefault(big, alloc)
    start_kv_prefault(small, PageAllocator(1024, 16))
    try:
        assert big.lazy and big.prefaulter is not None
        assert not small.lazy and small.prefaulter is None
        alloc.alloc_extend(-1, 0, 4000)  # the frontier moves to 4,000 slots: the prefaulter follows
        want = min(65536, 4000 + big.prefaulter.ahead_slots)
        deadline = time.monotonic() + 20
        while big.prefaulter.done < want:
            assert time.monotonic() < deadline, (big.prefaulter.done, want)
            time.sleep(0.02)
    finally:
        big.prefaulter.close()


def test_a_pool_of_several_entry_shapes_is_faulted_in_every_group():
    """Per-layer entry shapes (groups, mem/kv_pool.py): one prefaulter over every group's planes, each faulted
    in over the slots it was asked for, nothing past them."""
    shapes = [(2, 64), (1, 128), (2, 64)]  # groups [2, 2, 2, S, 64] and [2, 1, 1, S, 128]
    p = KVPool(65536, 3, 0, 0, torch.bfloat16, torch.device("cpu"), 1, 16, shapes=shapes)
    assert p.lazy and len(p.groups) == 2
    blocks = [g.block for g in p.groups]
    for b in blocks:
        assert _libc.madvise(b.data_ptr(), b.numel() * b.element_size(), MADV_NOHUGEPAGE) == 0
    assert KVPrefaulter.for_pool(blocks, lambda: 0).ahead_slots == AHEAD_BYTES // (p.nbytes // 65536)
    pf = KVPrefaulter(blocks, lambda: 2000, ahead_slots=1000, window_slots=1024)
    assert pf.planes == 8 + 2
    while pf.step():
        pass
    want = 3000
    assert pf.done == want
    for b in blocks:
        last = b.numel() // (b.shape[3] * b.shape[4]) - 1
        assert all(resident(b, last, 0, want - 64))
        assert not any(resident(b, 0, want + 64, min(65536, want + 4096)))
