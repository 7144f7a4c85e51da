"""PeerRateLimit: token buckets per sender for a link's reader thread (server/frontend_socket.py, disagg/link.py).

A message costs one token of its sender's bucket (rate tokens a second, at most burst saved up); a message
that finds the bucket empty is dropped by the caller and counted. The buckets live in an LRU of at most
max_peers senders, so a stranger cycling through new identities costs a bounded dict, and a shared bucket
(`total`) bounds every sender together. Plain Python, one thread (the reader's): no locks.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable, Hashable, Optional


class TokenBucket:
    __slots__ = ("rate", "burst", "tokens", "at")

    def __init__(self, rate: float, burst: float, now: float):
        self.rate, self.burst, self.tokens, self.at = rate, burst, burst, now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class PeerRateLimit:
    def __init__(self, rate: float, burst: float, total_rate: Optional[float] = None, max_peers: int = 4096,
                 clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self.max_peers, self.clock = rate, burst, max_peers, clock
        self._peers: OrderedDict[Hashable, TokenBucket] = OrderedDict()
        self.total = TokenBucket(total_rate, 2 * total_rate, clock()) if total_rate else None

    def allow(self, peer: Hashable) -> bool:
        """Whether peer may send this message now (a token of its bucket, and of the shared one, taken)."""
        now = self.clock()
        b = self._peers.get(peer)
        if b is None:
            b = self._peers[peer] = TokenBucket(self.rate, self.burst, now)
            if len(self._peers) > self.max_peers:
                self._peers.popitem(last=False)
        else:
            self._peers.move_to_end(peer)
        if not b.take(now):
            return False
        return self.total is None or self.total.take(now)
