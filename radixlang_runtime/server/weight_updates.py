"""The server's side of a weight update (SGLang's order): new generate requests wait at the gate, the running ones
finish (or, with abort_all_requests, are aborted), every replica's scheduler replaces its weights and flushes its
prefix cache, then the gate opens and the waiting requests run on the new weights. weight_version names the
weights served (SGLang's default "default"); an update may set it."""

from __future__ import annotations

import asyncio
import time
from typing import Optional

from radixlang_runtime.protocol.messages import GetWeightsReq, UpdateWeightsReq
from radixlang_runtime.scheduler.weight_sync import BUSY

DEFAULT_WEIGHT_VERSION = "default"


class WeightGate:
    """Open unless an update runs; `held` counts the requests that waited for the one running."""

    def __init__(self) -> None:
        self._open: Optional[asyncio.Event] = None
        self.held = 0
        self.weight_version = DEFAULT_WEIGHT_VERSION
        self.lock: Optional[asyncio.Lock] = None

    def _event(self) -> asyncio.Event:
        if self._open is None:
            self._open = asyncio.Event()
            self._open.set()
        return self._open

    async def wait(self) -> None:
        ev = self._event()
        if not ev.is_set():
            self.held += 1
            await ev.wait()

    def close(self) -> None:
        self._event().clear()
        self.held = 0

    def open(self) -> None:
        self._event().set()


async def update_weights_from_disk(tm, model_path: str, load_format: Optional[str] = None,
                                   abort_all_requests: bool = False, weight_version: Optional[str] = None,
                                   timeout: float = 600.0) -> tuple[bool, str, int]:
    """(success, message, num_paused_requests): the requests that waited at the gate while it ran."""
    gate: WeightGate = tm.weight_gate
    if gate.lock is None:
        gate.lock = asyncio.Lock()
    async with gate.lock:
        gate.close()
        try:
            deadline = time.monotonic() + timeout
            if abort_all_requests:
                for rid in list(tm.states):
                    tm.abort(rid)
            while tm.states:  # the requests already sent finish on the old weights
                if time.monotonic() > deadline:
                    return False, f"{len(tm.states)} request(s) still running after {timeout} s", gate.held
                await asyncio.sleep(0.02)
            for replica in range(len(tm.to_replicas)):
                while True:
                    out = await tm._control_call(UpdateWeightsReq, model_path, load_format, replica=replica,
                                                 timeout=max(1.0, deadline - time.monotonic()))
                    if out.message != BUSY or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.02)  # another frontend's requests (the DSL link) still run
                if not out.success:
                    return False, out.message, gate.held
            if weight_version is not None:
                gate.weight_version = weight_version
            return True, out.message, gate.held
        finally:
            gate.open()


async def get_weights_by_name(tm, name: str, truncate_size: int = 100) -> list:
    """The first replica's values (ValueError naming the parameter when it cannot be read)."""
    out = await tm._control_call(GetWeightsReq, name, truncate_size)
    if out.values is None:
        raise ValueError(out.error or f"no parameter {name!r}")
    return out.values
