"""Liveness on the ZeroMQ link: silence counted over the observer's awake time (SilenceClock), and
the frontend with fake clients: a slow client that keeps pinging keeps its request through a stall of the
server's event loop longer than the timeout; a client that goes silent loses its request within the bound."""

from __future__ import annotations

import asyncio
import threading
import time
import types

import zmq
import zmq.asyncio

from radixlang_runtime.protocol import messages as m
from radixlang_runtime.utils.liveness import SilenceClock
from radixlang_runtime.server import frontend_zmq
from radixlang_runtime.server.frontend_zmq import FrontendServer
from server_utils import free_port


def test_a_stall_of_the_observer_counts_one_step_not_its_length():
    clock = SilenceClock(max_step=2.0, now=0.0)
    clock.heard("a")
    clock.tick(1.0)
    assert clock.silence("a") == 1.0
    clock.tick(31.0)  # the observer was starved for 30 s: the peer's pings may be waiting unread
    assert clock.silence("a") == 3.0 and clock.silent_peers(10.0) == []
    for t in range(32, 40):
        clock.tick(float(t))
    assert clock.silence("a") == 11.0 and clock.silent_peers(10.0) == ["a"]
    clock.heard("a")
    clock.cap("b", 1.0)
    assert clock.silence("a") == 0.0 and clock.silence("b") == 0.0


def _pinger(address: str, every_s: float, stop: threading.Event) -> None:
    """A fake client: one request that never finishes (pin_prefix on a tm that waits forever), then pings
    every `every_s` until stopped (then silent, like a client that died without a word)."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    s.send(m.encode(m.FrontendReq("held", "pin_prefix", {"input_ids": [1]}, None)))
    while not stop.wait(every_s):
        s.send(m.encode(m.FrontendReq("ping", "ping", None, None)))
    s.close(0)
    ctx.term()


def test_a_slow_client_survives_a_stalled_server_and_a_silent_one_is_dropped(monkeypatch):
    monkeypatch.setattr(frontend_zmq, "CLIENT_TIMEOUT_S", 1.5)
    monkeypatch.setattr(frontend_zmq, "JANITOR_EVERY_S", 0.1)
    address = f"tcp://127.0.0.1:{free_port()}"

    async def main() -> dict:
        async def pin_forever(ids, ttl_s, owner=""):
            await asyncio.Event().wait()

        tm = types.SimpleNamespace(metrics=None, pin_prefix=pin_forever)
        tm.run_intake = lambda fn, *a, size=0: asyncio.sleep(0, result=([1], None))
        fs = FrontendServer(address, types.SimpleNamespace(routes=[]), tm, None)
        fs.start()
        stop = threading.Event()
        client = threading.Thread(target=_pinger, args=(address, 0.5, stop), daemon=True)
        client.start()
        seen = {}
        try:
            deadline = time.monotonic() + 20
            while not fs._tasks and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert fs._tasks, "the request never arrived"
            time.sleep(3.0)  # the server's event loop stalls twice the timeout; the client keeps pinging
            await asyncio.sleep(1.0)  # the janitor runs ten times after the stall
            seen["after_stall"] = len(fs._tasks)
            stop.set()  # the client goes silent
            t0 = time.monotonic()
            while fs._tasks and time.monotonic() - t0 < 10:
                await asyncio.sleep(0.05)
            seen["dropped_after_s"] = time.monotonic() - t0 if not fs._tasks else None
        finally:
            stop.set()
            client.join(5)
            await fs.close()
        return seen

    seen = asyncio.run(main())
    assert seen["after_stall"] == 1  # its request still in flight
    assert seen["dropped_after_s"] is not None  # dropped (its request cancelled) within the 10 s bound
