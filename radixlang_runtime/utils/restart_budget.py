"""RestartBudget: how often a supervised loop may fail and be restarted (at most max_restarts within window_s
seconds) before it stays down and its owner reports it (the ZeroMQ frontend's loops and socket thread, the
PD link's thread)."""

from __future__ import annotations

import time
from typing import Callable


class RestartBudget:
    def __init__(self, max_restarts: int, window_s: float, clock: Callable[[], float] = time.monotonic):
        self.max_restarts, self.window_s, self.clock = max_restarts, window_s, clock
        self._at: list[float] = []  # the restarts within the window

    def allow(self) -> bool:
        """A failure now: whether a restart is allowed (and counted)."""
        now = self.clock()
        self._at = [t for t in self._at if now - t < self.window_s]
        if len(self._at) >= self.max_restarts:
            return False
        self._at.append(now)
        return True

    def recent(self) -> int:
        """Restarts within the window, as of the last call."""
        return len(self._at)
