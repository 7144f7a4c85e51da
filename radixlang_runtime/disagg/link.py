"""The PD transport: ZeroMQ sockets owned by one I/O thread, so heartbeats flow while the scheduler steps.

BootstrapServer (prefill): a ROUTER socket bound on the bootstrap port; peers are the decode DEALERs'
routing ids. BootstrapClient (decode): one DEALER per prefill `host:port`, pinged every heartbeat/5 s.
Both answer or send PDPing / PDPong in the thread (the scheduler never sees them) and record when each peer
was last heard from: `silent_for(peer)` is what the roles (prefill.py / decode.py) compare with the
heartbeat timeout. The scheduler thread only calls `send` (queued; the thread sends, never blocking:
a message to a peer whose queue is full is dropped, the roles' timeouts then end the transfer) and
`receive` (what arrived since the last call). Messages are messages.py's PD dataclasses.

Invariant: every wait here is bounded (poll timeouts of POLL_S; close joins the thread for <= 2 s).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Hashable

import zmq

from radixlang_runtime.messages import PDPing, PDPong, decode, encode

logger = logging.getLogger(__name__)
POLL_S = 0.02  # the thread's poll timeout: the latency of a queued send
HWM = 10_000  # messages queued per peer before sends to it are dropped


class _Link:
    """The shared thread loop; subclasses own the sockets."""

    def __init__(self, heartbeat_timeout: float):
        self.ping_every = max(heartbeat_timeout / 5, 0.01)
        self._ctx = zmq.Context()
        self._out: queue.Queue[tuple[Any, bytes]] = queue.Queue()
        self._in: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self._seen: dict[Any, float] = {}  # peer -> time.monotonic() of its last message (or of our first send)
        self._stop = threading.Event()
        self.sent_bytes = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, peer: Hashable, msg: Any) -> None:
        self._out.put((peer, encode(msg)))

    def receive(self) -> list[tuple[Any, Any]]:
        out = []
        while True:
            try:
                out.append(self._in.get_nowait())
            except queue.Empty:
                return out

    def silent_for(self, peer: Hashable) -> float:
        """Seconds since peer was last heard from (since we first addressed it, when never)."""
        return time.monotonic() - self._seen.get(peer, time.monotonic())

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        try:
            self._setup()
            last_ping = 0.0
            while not self._stop.is_set():
                self._flush_out()
                now = time.monotonic()
                if now - last_ping >= self.ping_every:
                    last_ping = now
                    self._ping()
                self._poll_in()
        except Exception:  # noqa: BLE001 - the roles see every peer go silent and fail their transfers
            logger.exception("PD link thread failed")
        finally:
            self._teardown()

    def _flush_out(self) -> None:
        while True:
            try:
                peer, data = self._out.get_nowait()
            except queue.Empty:
                return
            self._seen.setdefault(peer, time.monotonic())
            try:
                self._send_raw(peer, data)
                self.sent_bytes += len(data)
            except zmq.Again:
                self.dropped += 1

    def _note(self, peer: Any, data: bytes) -> None:
        self._seen[peer] = time.monotonic()
        try:
            msg = decode(data)
        except Exception:  # noqa: BLE001 - a malformed message is dropped, never fatal
            logger.warning("PD link: undecodable message from %r dropped", peer)
            return
        if isinstance(msg, PDPing):
            self._send_raw(peer, encode(PDPong(msg.seq)))
        elif not isinstance(msg, PDPong):
            self._in.put((peer, msg))

    # subclass hooks
    def _setup(self) -> None: ...
    def _teardown(self) -> None: ...
    def _ping(self) -> None: ...
    def _poll_in(self) -> None: ...
    def _send_raw(self, peer: Any, data: bytes) -> None: ...


class BootstrapServer(_Link):
    """Prefill side: ROUTER on tcp://host:port (bound before start() returns, so a taken port fails at once)."""

    def __init__(self, host: str, port: int, heartbeat_timeout: float):
        super().__init__(heartbeat_timeout)
        self.sock = self._ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, HWM)
        self.sock.setsockopt(zmq.RCVHWM, HWM)
        self.sock.bind(f"tcp://{host}:{port}")

    def _poll_in(self) -> None:
        if self.sock.poll(int(POLL_S * 1000)):
            while True:
                try:
                    peer, data = self.sock.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    return
                self._note(peer, data)

    def _send_raw(self, peer: Any, data: bytes) -> None:
        self.sock.send_multipart([peer, data], flags=zmq.NOBLOCK)

    def _teardown(self) -> None:
        self.sock.close(linger=0)
        self._ctx.term()


class BootstrapClient(_Link):
    """Decode side: a DEALER per prefill (peer = (host, port)), created at the first send to it."""

    def __init__(self, heartbeat_timeout: float):
        super().__init__(heartbeat_timeout)
        self.socks: dict[Any, zmq.Socket] = {}
        self._poller = zmq.Poller()
        self._seq = 0

    def _sock(self, peer: Any) -> zmq.Socket:
        s = self.socks.get(peer)
        if s is None:
            host, port = peer
            s = self._ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, HWM)
            s.setsockopt(zmq.RCVHWM, HWM)
            s.setsockopt(zmq.RECONNECT_IVL, 100)
            s.connect(f"tcp://{host}:{port}")
            self.socks[peer] = s
            self._poller.register(s, zmq.POLLIN)
        return s

    def _send_raw(self, peer: Any, data: bytes) -> None:
        self._sock(peer).send(data, flags=zmq.NOBLOCK)

    def _ping(self) -> None:
        self._seq += 1
        for peer, s in self.socks.items():
            try:
                s.send(encode(PDPing(self._seq)), flags=zmq.NOBLOCK)
            except zmq.Again:
                pass

    def _poll_in(self) -> None:
        if not self.socks:
            time.sleep(POLL_S)
            return
        ready = dict(self._poller.poll(int(POLL_S * 1000)))
        for peer, s in list(self.socks.items()):
            if s not in ready:
                continue
            while True:
                try:
                    data = s.recv(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._note(peer, data)

    def _teardown(self) -> None:
        for s in self.socks.values():
            s.close(linger=0)
        self._ctx.term()
