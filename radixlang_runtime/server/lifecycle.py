"""Lifecycle: the server's availability in one record (torch-free). The TokenizerManager owns one;
admission (every request's entry, `TokenizerManager.generate` / `prepare`), /health and the drain read
it, nothing else keeps a copy.

States, in order: serving -> draining (SIGTERM / SIGINT: new work is refused with ShuttingDown, HTTP
503; the requests in flight run on until they finish or the drain time runs out) -> stopped. `dead`
(a child process exited) overrides both: new work gets RuntimeUnavailable, /health 503.

Health also tells the truth about progress: every scheduler sends a SchedulerHeartbeat at least every
HEARTBEAT_S while its loop turns (idle or busy; server/scheduler_process.py), and a replica that has
requests in flight but no heartbeat for stall_timeout_s seconds is reported stuck (a step that never
returns). A legitimately long step only counts if it alone lasts stall_timeout_s (a 4,096-token
prefill chunk of the embedded model takes ~1-2 s on CPU).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

SHUTTING_DOWN = "server is shutting down"
HEARTBEAT_S = 0.5  # a scheduler's loop sends one at most this often (scheduler_process.ZmqIO)


class RuntimeUnavailable(RuntimeError):
    """The scheduler or detokenizer process is gone: HTTP 503."""


class RequestUnavailable(RuntimeUnavailable):
    """One request could not be served (a PD transfer failed: its peer died, a timeout, the decode pool full);
    the server serves on. HTTP 503 with the scheduler's message."""


class ShuttingDown(RuntimeUnavailable):
    """The server drains: new work is refused, or a request ran past the drain time. HTTP 503; its
    message starts with SHUTTING_DOWN."""


@dataclass
class Lifecycle:
    num_replicas: int = 1
    stall_timeout_s: float = 30.0
    dead: Optional[str] = None  # why a child process is gone (set once, never cleared)
    draining: bool = False
    cut_now: bool = False  # a second signal: end the drain without waiting
    heartbeat_at: list[float] = field(default_factory=list)  # time.monotonic() of each replica's last

    def __post_init__(self) -> None:
        now = time.monotonic()
        self.heartbeat_at = [now] * self.num_replicas

    def admit(self) -> None:
        """Raise unless new work may start: RuntimeUnavailable (dead) or ShuttingDown (draining)."""
        if self.dead:
            raise RuntimeUnavailable(self.dead)
        if self.draining:
            raise ShuttingDown(SHUTTING_DOWN)

    def on_heartbeat(self, replica: int) -> None:
        if 0 <= replica < self.num_replicas:
            self.heartbeat_at[replica] = time.monotonic()

    def stalled(self, in_flight: Sequence[int], now: Optional[float] = None) -> Optional[str]:
        """Why the runtime is stuck, or None: a replica with requests in flight (in_flight[i]) and no
        heartbeat for stall_timeout_s."""
        now = time.monotonic() if now is None else now
        for i, n in enumerate(in_flight):
            quiet = now - self.heartbeat_at[i]
            if n > 0 and quiet > self.stall_timeout_s:
                who = "the scheduler" if self.num_replicas == 1 else f"the scheduler of replica {i}"
                return (f"{who} made no progress for {quiet:.0f} s with {n} request(s) in flight "
                        f"(--health-stall-timeout {self.stall_timeout_s:g} s)")
        return None

    def unhealthy(self, in_flight: Sequence[int], now: Optional[float] = None) -> Optional[str]:
        """Why /health answers 503, or None (healthy)."""
        if self.dead:
            return self.dead
        if self.draining:
            return SHUTTING_DOWN
        return self.stalled(in_flight, now)
