"""Token-slot allocator over pages of `page_size` slots (torch-free).

Slots are the first index of every per-layer K/V buffer. Slot s lives in page s // page_size.
Invariants:
- a page is either free (in `_free_pages`) or owned by exactly one holder (a request, or later the
  radix cache); `check_integrity()` verifies free + allocated == total with no duplicates.
- `alloc_extend` keeps a holder's position p at page offset p % page_size, so a page never holds
  tokens of two holders and freeing a holder's slots frees whole pages.
- freed pages are reused before pages never used, which leave in id order: pages ever handed out
  are exactly 0 .. touched_pages - 1 (the resident part of a lazily committed pool).
"""

from __future__ import annotations

from collections import deque
from typing import Iterable


class OutOfSlotsError(RuntimeError):
    pass


def slots_spanned(cur_len: int, extend_len: int, page_size: int) -> int:
    """Slots of new pages a holder at length cur_len needs to grow by extend_len."""
    new_pages = -(-(cur_len + extend_len) // page_size) - (-(-cur_len // page_size))
    return new_pages * page_size


class PageAllocator:
    def __init__(self, num_slots: int, page_size: int = 1):
        if page_size < 1 or num_slots < page_size:
            raise ValueError(f"need num_slots >= page_size >= 1 (got {num_slots}, {page_size})")
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        self.total_slots = self.num_pages * page_size
        self._free_pages: deque[int] = deque(range(self.num_pages))
        self._allocated_pages = 0
        # Freed pages rejoin the front and are handed out first; pages never used wait behind them in
        # id order. So the pool's touched part stays as small as the peak in use + cached (its pages
        # are resident memory: mem/kv_memory.py), and the pages ever handed out are exactly
        # 0 .. touched_pages - 1.
        self.touched_pages = 0

    # --- sizes ---
    @property
    def free_pages(self) -> int:
        return len(self._free_pages)

    def available_size(self) -> int:
        """Free slots (whole free pages)."""
        return len(self._free_pages) * self.page_size

    def slots_needed(self, cur_len: int, extend_len: int) -> int:
        """Slots of new pages a holder at length cur_len needs to grow by extend_len."""
        return slots_spanned(cur_len, extend_len, self.page_size)

    # --- allocate / free ---
    def alloc_extend(self, last_slot: int, cur_len: int, extend_len: int) -> list[int]:
        """Slots for positions cur_len .. cur_len+extend_len-1 of one holder.

        last_slot: the holder's slot at position cur_len-1 (ignored when cur_len % page_size == 0).
        """
        ps = self.page_size
        if ps == 1:
            if extend_len > len(self._free_pages):
                raise OutOfSlotsError(f"need {extend_len} slots, {len(self._free_pages)} free")
            pop = self._free_pages.popleft
            out = [pop() for _ in range(extend_len)]
            self._allocated_pages += extend_len
            if out:
                self.touched_pages = max(self.touched_pages, max(out) + 1)
            return out
        need = self.slots_needed(cur_len, extend_len) // ps
        if need > len(self._free_pages):
            raise OutOfSlotsError(f"need {need} pages, {len(self._free_pages)} free")
        out: list[int] = []
        pos = cur_len
        if pos % ps:  # finish the partially filled last page first
            tail = min(ps - pos % ps, extend_len)
            out.extend(range(last_slot + 1, last_slot + 1 + tail))
            pos += tail
        end = cur_len + extend_len
        while pos < end:
            page = self._free_pages.popleft()
            self.touched_pages = max(self.touched_pages, page + 1)
            base = page * ps
            n = min(ps, end - pos)
            out.extend(range(base, base + n))
            pos += n
        self._allocated_pages += need
        return out

    def free(self, slots: Iterable[int]) -> None:
        """Free the pages holding `slots` (all of a holder's slots, or whole pages of them)."""
        ps = self.page_size
        pages = list(slots) if ps == 1 else sorted({s // ps for s in slots})
        self._free_pages.extendleft(reversed(pages))  # reused first, in the order given
        self._allocated_pages -= len(pages)

    def free_page_ids(self) -> list[int]:
        return list(self._free_pages)

    # --- checks ---
    def check_integrity(self, expected_in_use_slots: int | None = None) -> None:
        free = self._free_pages
        if len(set(free)) != len(free):
            raise AssertionError("allocator: a page is on the free list twice")
        if len(free) + self._allocated_pages != self.num_pages:
            raise AssertionError(
                f"allocator: free {len(free)} + allocated {self._allocated_pages} != total {self.num_pages} pages"
            )
        if expected_in_use_slots is not None and expected_in_use_slots != self._allocated_pages * self.page_size:
            raise AssertionError(
                f"allocator: holders own {expected_in_use_slots} slots but "
                f"{self._allocated_pages * self.page_size} are allocated"
            )

    @property
    def allocated_slots(self) -> int:
        return self._allocated_pages * self.page_size
