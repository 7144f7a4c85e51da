"""PageAllocator and TableManager (torch-free)."""

from __future__ import annotations

import random

import pytest

from radixlang_runtime.mem.allocator import OutOfSlotsError, PageAllocator
from radixlang_runtime.mem.table import TableManager


@pytest.mark.parametrize("ps", [1, 16])
def test_alloc_extend_keeps_positions_page_aligned(ps):
    a = PageAllocator(1024, ps)
    slots: list[int] = []
    for n in [5, 1, 1, 13, 40, 1, 3]:
        new = a.alloc_extend(slots[-1] if slots else -1, len(slots), n)
        assert len(new) == n
        slots += new
    for pos, s in enumerate(slots):
        assert s % ps == pos % ps  # position p sits at page offset p % ps
    assert len(set(slots)) == len(slots)
    assert a.allocated_slots == -(-len(slots) // ps) * ps
    a.check_integrity(expected_in_use_slots=a.allocated_slots)
    a.free(slots)
    assert a.available_size() == a.total_slots
    a.check_integrity(expected_in_use_slots=0)


@pytest.mark.parametrize("ps", [1, 16])
def test_random_holders_never_share_pages(ps):
    rng = random.Random(0)
    a = PageAllocator(2048, ps)
    holders: dict[int, list[int]] = {}
    for step in range(2000):
        if holders and rng.random() < 0.3:
            h = rng.choice(list(holders))
            a.free(holders.pop(h))
            continue
        h = rng.randrange(40)
        cur = holders.setdefault(h, [])
        n = rng.randrange(1, 30)
        try:
            cur += a.alloc_extend(cur[-1] if cur else -1, len(cur), n)
        except OutOfSlotsError:
            continue
        pages = [{s // ps for s in v} for v in holders.values()]
        assert sum(len(p) for p in pages) == len(set().union(*pages))
        a.check_integrity(expected_in_use_slots=sum(len(p) for p in pages) * ps)
    for v in holders.values():
        a.free(v)
    assert a.available_size() == a.total_slots


def test_out_of_slots_is_an_error_not_a_partial_allocation():
    a = PageAllocator(32, 16)
    a.alloc_extend(-1, 0, 20)
    with pytest.raises(OutOfSlotsError):
        a.alloc_extend(-1, 0, 17)
    assert a.available_size() == 0
    a.check_integrity(expected_in_use_slots=32)


def test_integrity_catches_double_free():
    a = PageAllocator(8, 1)
    s = a.alloc_extend(-1, 0, 2)
    a.free(s)
    a.free(s[:1])
    with pytest.raises(AssertionError):
        a.check_integrity()


def test_table_rows():
    t = TableManager(3)
    rows = [t.allocate() for _ in range(3)]
    assert sorted(rows) == [0, 1, 2]
    with pytest.raises(RuntimeError):
        t.allocate()
    t.free(rows[1])
    t.check_integrity(rows_in_use=2)


def test_freed_pages_are_reused_before_untouched_ones():
    """The touched part of the pool stays as small as the peak in use: 0 .. touched_pages - 1."""
    from radixlang_runtime.mem.allocator import PageAllocator

    for ps in (1, 16):
        a = PageAllocator(64 * ps, ps)
        held = [a.alloc_extend(-1, 0, 3 * ps) for _ in range(4)]
        assert a.touched_pages == 12
        for h in held:
            a.free(h)
        for _ in range(10):  # churn at the same peak: no new page is touched
            x = a.alloc_extend(-1, 0, 12 * ps)
            a.free(x)
        assert a.touched_pages == 12
        a.alloc_extend(-1, 0, 13 * ps)
        assert a.touched_pages == 13
