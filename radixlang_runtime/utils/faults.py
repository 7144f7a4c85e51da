"""Fault injection for tests of fault containment (torch-free). Off unless RADIXLANG_FAULT_INJECT is set.

RADIXLANG_FAULT_INJECT="site:rid_prefix[:stall=SECONDS][,...]": at `site` ("forward" in the model
runner, before the forward pass; "detokenize" in the detokenizer), work that touches a request whose
rid starts with rid_prefix raises InjectedFault; with ":stall=SECONDS" it sleeps that long instead,
once per request (a step that hangs, then goes on: tests of /health's stall report). The variable is
read at every check (a dict lookup), so tests can switch it on and off in a running process; child
processes inherit it at spawn.
"""

from __future__ import annotations

import os
import time
from typing import Iterable

ENV = "RADIXLANG_FAULT_INJECT"
_stalled: set[str] = set()  # rids already stalled in this process (each stalls once)


class InjectedFault(RuntimeError):
    """Raised on purpose (RADIXLANG_FAULT_INJECT)."""


class FatalFault(RuntimeError):
    """A fault the process cannot recover from (a tensor-parallel peer is gone): the requests in
    flight fail with its message, then the request loop stops and the process exits.
    `touched`: requests already failed where it was raised (the loop still has to report them)."""

    def __init__(self, message: str, touched: Iterable = ()):
        super().__init__(message)
        self.touched = list(touched)


def maybe_raise(site: str, rids: Iterable[str]) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    rules = []  # (rid prefix, stall seconds or None for a raise)
    for entry in spec.split(","):
        parts = entry.split(":")
        if parts[0] == site and len(parts) >= 2:
            stall = float(parts[2].removeprefix("stall=")) if len(parts) > 2 else None
            rules.append((parts[1], stall))
    if not rules:
        return
    for rid in rids:
        for prefix, stall in rules:
            if not rid.startswith(prefix):
                continue
            if stall is None:
                raise InjectedFault(f"injected {site} fault for request {rid}")
            if rid not in _stalled:
                _stalled.add(rid)
                time.sleep(stall)
