"""DisaggRole: what the Scheduler needs of a prefill-decode disaggregation role (torch-free; the roles live in
radixlang_runtime/disagg/, built by wiring.make_disagg_role)."""

from __future__ import annotations

from typing import Protocol

from radixlang_runtime.scheduler.request import Req


class DisaggRole(Protocol):
    """PD (docs/DISAGGREGATION.md). Both roles see every new request first (`add`: True when it queues for
    prefill as usual; a duplicate room is refused and comes back ended from the next `poll`). A prefill role
    gets requests past their first token (`hold`) and each finished chunk (`on_chunk`); a decode role keeps
    its new requests and returns them `ready` (K/V and first token in place) from `poll`. Requests it ends
    come back from `poll` / `take` released."""

    kind: str  # "prefill" | "decode"
    pending: bool  # requests held: the loop keeps turning

    def add(self, req: Req) -> bool: ...
    def hold(self, req: Req) -> None: ...
    def on_chunk(self, req: Req) -> None: ...
    def poll(self, n_running: int) -> tuple[list[Req], list[Req]]: ...
    def take(self, rids: set[str], failed: bool = False) -> list[Req]: ...
    def take_all(self) -> list[Req]: ...
    def held_reqs(self) -> list[Req]: ...
