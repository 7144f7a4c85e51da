"""Snapshot slots of the state pool (torch-free): where the radix cache keeps hybrid models' recurrent states.

The state pool (mem/state_pool.py) has `rows` request slots (slot r: the request in table row r) followed by
`count` snapshot slots. A snapshot slot is free, held by one radix node (TreeNode.state: the state after the
node's last token), or pending: taken for a step that is about to save a request's state into it, and held
by that request (Req.pending_state) until the step's result attaches it to its node or frees it.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable, Optional


class StateSlots:
    def __init__(self, first: int, count: int):
        self.first, self.count = first, count
        self._free: deque[int] = deque(range(first, first + count))

    @property
    def free_count(self) -> int:
        return len(self._free)

    def alloc(self) -> Optional[int]:
        """A free snapshot slot, or None when none is free."""
        return self._free.popleft() if self._free else None

    def free(self, slots: Iterable[int]) -> None:
        for s in slots:
            if not self.first <= s < self.first + self.count:
                raise AssertionError(f"state slot {s} is not a snapshot slot")
            self._free.append(s)

    def check_integrity(self, held: list[int]) -> None:
        """held: every slot the tree's nodes and the live requests hold (each once)."""
        owned = list(self._free) + held
        if len(set(owned)) != len(owned):
            raise AssertionError("state slots: a snapshot slot is free or held twice")
        if len(owned) != self.count:
            raise AssertionError(f"state slots: free {len(self._free)} + held {len(held)} != {self.count}")
