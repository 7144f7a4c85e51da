"""Fault injection for tests of fault containment (torch-free). Off unless RADIXLANG_FAULT_INJECT is set.

RADIXLANG_FAULT_INJECT="site:rid_prefix[,site:rid_prefix...]": at `site` ("forward" in the model
runner, before the forward pass; "detokenize" in the detokenizer), work that touches a request whose
rid starts with rid_prefix raises InjectedFault. The variable is read at every check (a dict lookup),
so tests can switch it on and off in a running process; child processes inherit it at spawn.
"""

from __future__ import annotations

import os
from typing import Iterable

ENV = "RADIXLANG_FAULT_INJECT"


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
    prefixes = [p.split(":", 1)[1] for p in spec.split(",") if p.startswith(site + ":")]
    if not prefixes:
        return
    for rid in rids:
        if any(rid.startswith(p) for p in prefixes):
            raise InjectedFault(f"injected {site} fault for request {rid}")
