"""SilenceClock: how long each peer of a link has been silent, counted over the observer's own awake time
(no imports beyond the standard library; the DSL's ZeroMQ client and the server's frontend both use it).

A link drops a peer that stays silent for a bound (the server a client, the client its server). Measured as
wall time since the peer's last message, a stall of the *observer* counts against the peer: a server whose
event loop was starved of CPU for 10 s wakes up, finds every client's last ping 10 s old and drops them
before it reads the pings waiting in its socket (seen under load average 17). So the observer ticks
(`tick(now)`, from its periodic check) and each tick adds the time since its previous tick, at most
`max_step`: a stall of the observer adds max_step, not its length. heard(peer) resets the peer to 0.
Invariant: silence(peer) <= the wall time since heard(peer); it grows by at most max_step per tick.
"""

from __future__ import annotations

import time
from typing import Hashable, Optional


class SilenceClock:
    def __init__(self, max_step: float, now: Optional[float] = None):
        if max_step <= 0:
            raise ValueError(f"max_step must be > 0; got {max_step}")
        self.max_step = max_step
        self._last_tick = time.monotonic() if now is None else now
        self._silence: dict[Hashable, float] = {}

    def heard(self, peer: Hashable) -> None:
        self._silence[peer] = 0.0

    def cap(self, peer: Hashable, most: float) -> None:
        """At most `most` seconds of silence so far (a peer nobody waits on is not yet overdue)."""
        self._silence[peer] = min(self._silence.get(peer, 0.0), most)

    def forget(self, peer: Hashable) -> None:
        self._silence.pop(peer, None)

    def tick(self, now: Optional[float] = None) -> None:
        now = time.monotonic() if now is None else now
        step = min(max(0.0, now - self._last_tick), self.max_step)
        self._last_tick = now
        for peer in self._silence:
            self._silence[peer] += step

    def silence(self, peer: Hashable) -> float:
        return self._silence.get(peer, 0.0)

    def silent_peers(self, bound: float) -> list[Hashable]:
        """The peers silent for more than `bound` seconds of the observer's awake time."""
        return [p for p, s in self._silence.items() if s > bound]
