"""The instances the router sends to: per role (prefill / decode / worker) a Group of Instances, the
choice among the eligible ones by placement.py's Placement (the same cache_aware / round_robin /
shortest_queue code as data-parallel replicas), and Tickets that fail a request's legs at once when
an instance it still waits on goes down.

Routing key (cache_aware): the prompt's UTF-8 bytes (a char-level key, as SGLang's router keys its
tree by text), or the request's token ids when it gives ids; see pd_proxy.routing_key.

Invariants:
- an Instance is eligible iff healthy and verified (its /server_info matched its role, and a prefill's
  bootstrap port is known); Group.choose only returns eligible instances;
- group.placement's load of instance i == requests routed to i and not yet finished (choose adds, finish
  removes once per rid);
- instance.tickets holds the tickets of requests with a leg still outstanding on it; mark_down fails
  each of them (Ticket.fail keeps the first reason).
Not thread-safe: everything runs on the router's one event loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence
from urllib.parse import urlparse

from radixlang_runtime.router.config import InstanceSpec, RouterArgs
from radixlang_runtime.placement import Placement


class UpstreamError(Exception):
    """One leg of a request failed: `status` is what the router answers (502 for a failed upstream,
    an upstream's own 4xx passes through with its body)."""

    def __init__(self, instance: "Instance", reason: str, status: int = 502, body: Optional[dict] = None):
        super().__init__(f"{instance.role} instance {instance.url} {reason}")
        self.instance, self.reason, self.status, self.body = instance, reason, status, body


class NoInstance(Exception):
    """No eligible instance of a role (HTTP 503)."""


class Ticket:
    """A request in flight: `failed` resolves with the UpstreamError of the first instance it waits on
    that goes down."""

    def __init__(self) -> None:
        self.failed: asyncio.Future = asyncio.get_running_loop().create_future()

    def fail(self, error: UpstreamError) -> None:
        if not self.failed.done():
            self.failed.set_result(error)


@dataclass(eq=False)
class Instance:
    role: str  # "prefill" | "decode" | "worker"
    index: int  # its replica index in its group's Placement
    url: str
    bootstrap_port: Optional[int] = None
    healthy: bool = False
    verified: bool = False  # /server_info matched the role (and gave the bootstrap port if needed)
    reason: str = "not checked yet"  # why it is not eligible (the last failure)
    fails: int = 0  # failed health checks in a row
    oks: int = 0  # good health checks in a row
    routed: int = 0
    errors: int = 0  # requests whose leg here failed
    tickets: set = field(default_factory=set)

    @property
    def host(self) -> str:
        return urlparse(self.url).hostname or ""

    @property
    def eligible(self) -> bool:
        return self.healthy and self.verified

    def mark_down(self, reason: str) -> None:
        """Not eligible any more; every request still waiting on it fails now, naming it."""
        self.healthy, self.oks, self.reason = False, 0, reason
        for t in list(self.tickets):
            t.fail(UpstreamError(self, reason))

    def view(self, load: int) -> dict[str, Any]:
        return {"url": self.url, "role": self.role, "bootstrap_port": self.bootstrap_port,
                "healthy": self.healthy, "verified": self.verified, "eligible": self.eligible,
                "reason": None if self.eligible else self.reason, "in_flight": load,
                "routed": self.routed, "errors": self.errors}


class Group:
    """The instances of one role and the policy that picks among them."""

    def __init__(self, role: str, specs: Sequence[InstanceSpec], args: RouterArgs):
        self.role = role
        self.instances = [Instance(role, i, s.url, s.bootstrap_port) for i, s in enumerate(specs)]
        self.placement = Placement(len(specs), args.placement_config(role))

    def choose(self, rid: str, key: Sequence[int]) -> Instance:
        eligible = [i.index for i in self.instances if i.eligible]
        if not eligible:
            why = "; ".join(f"{i.url}: {i.reason}" for i in self.instances)
            raise NoInstance(f"no healthy {self.role} instance ({why})")
        inst = self.instances[self.placement.route(rid, key, eligible)]
        inst.routed += 1
        return inst

    def finish(self, rid: str) -> None:
        self.placement.finish(rid)

    def view(self) -> list[dict[str, Any]]:
        loads = self.placement.loads()
        return [i.view(loads[i.index]) for i in self.instances]
