"""LRU: a dict bounded by entry count and by a total size (bytes, or any additive weight).

Invariants: total == sum of the sizes of the entries held; after put(), len <= max_entries and
total <= max_size unless a single entry is larger than max_size (it is then the only entry kept).
Not thread-safe: callers that share one hold their own lock.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Hashable, Optional, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    def __init__(self, max_entries: int, max_size: float = float("inf")):
        assert max_entries >= 1
        self.max_entries = max_entries
        self.max_size = max_size
        self._d: OrderedDict[K, tuple[V, float]] = OrderedDict()
        self.total = 0.0

    def get(self, key: K) -> Optional[V]:
        item = self._d.get(key)
        if item is None:
            return None
        self._d.move_to_end(key)
        return item[0]

    def put(self, key: K, value: V, size: float = 1.0) -> None:
        old = self._d.pop(key, None)
        if old is not None:
            self.total -= old[1]
        self._d[key] = (value, size)
        self.total += size
        while len(self._d) > 1 and (len(self._d) > self.max_entries or self.total > self.max_size):
            _, (_, s) = self._d.popitem(last=False)
            self.total -= s

    def reweigh(self, size_of: Callable[[V], float]) -> list[V]:
        """Entries whose size changed since put() (a grammar's caches grow): sizes recomputed with size_of,
        then the least recently used evicted while over the bounds. Returns the evicted values."""
        self.total = 0.0
        for key, (value, _) in list(self._d.items()):
            size = size_of(value)
            self._d[key] = (value, size)
            self.total += size
        evicted = []
        while len(self._d) > 1 and self.total > self.max_size:
            _, (v, s) = self._d.popitem(last=False)
            self.total -= s
            evicted.append(v)
        return evicted

    def remove(self, key: K) -> Optional[V]:
        item = self._d.pop(key, None)
        if item is None:
            return None
        self.total -= item[1]
        return item[0]

    def values(self) -> list[V]:
        return [v for v, _ in self._d.values()]

    def __contains__(self, key: K) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def clear(self) -> None:
        self._d.clear()
        self.total = 0.0
