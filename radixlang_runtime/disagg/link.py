"""The PD transport: ZeroMQ sockets owned by one I/O thread, so heartbeats flow while the scheduler steps.

BootstrapServer (prefill): a ROUTER socket bound on the bootstrap port; peers are the decode DEALERs'
routing ids. BootstrapClient (decode): one DEALER per prefill `host:port`, pinged every heartbeat/5 s.
Both answer or send PDPing / PDPong in the thread (the scheduler never sees them) and record when each peer
was last heard from: `silent_for(peer)` is what the roles (prefill.py / decode.py) compare with the
heartbeat timeout. The scheduler thread only calls `send` (queued; the thread sends, never blocking:
a message to a peer whose queue is full is dropped, the roles' timeouts then end the transfer) and
`receive` (what arrived since the last call, or with max_bytes only as much K/V as one step should
write). Messages are messages.py's PD dataclasses, one ZeroMQ frame each, except PDKVChunk: its header
and its payload travel as two frames, and the receiver's payload is a memoryview of ZeroMQ's own buffer
(no copy into Python bytes, none out of msgpack).

Flow control (decode side): the client stops reading its sockets while `in_bytes` (K/V payload received
and not yet taken by `receive`) is at `max_buffered`; its small RCVHWM then leaves the rest in the socket,
and TCP pushes back to the prefill, whose ZeroMQ queue holds it. So a transfer's receiving (the copies,
the kernel's and ZeroMQ's work on the decode's core) keeps pace with what the scheduler writes per step
instead of landing in one burst between two decode steps (docs/PERFORMANCE.md, PD). A readable socket
that is not read counts as a live peer (its pongs may wait behind K/V).

Invariant: every wait here is bounded (poll timeouts of POLL_S; close joins the thread for <= 2 s).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections import deque
from typing import Any, Hashable, Optional

import zmq

from radixlang_runtime.messages import PDKVChunk, PDPing, PDPong, decode, encode

logger = logging.getLogger(__name__)
POLL_S = 0.02  # the thread's poll timeout: the latency of a queued send
HWM = 10_000  # messages queued per peer before sends to it are dropped
CLIENT_RCVHWM = 4  # messages a decode's socket takes in ahead of its link thread (the rest stays in TCP)
MAX_BUFFERED = 2 << 20  # K/V payload bytes a decode's link holds for its scheduler before it stops reading


def to_frames(msg: Any) -> list[bytes]:
    """A message's frames on the wire: [encode(msg)], or for a PDKVChunk [its header, its payload]."""
    if isinstance(msg, PDKVChunk):
        return [encode(dataclasses.replace(msg, payload=b"")), msg.payload]
    return [encode(msg)]


def from_frames(frames: list[Any]) -> Any:
    """to_frames' inverse over received frames (bytes or zmq.Frame): a chunk's payload is a memoryview of its
    frame. ValueError for a frame count its message type does not have."""
    head = frames[0].bytes if isinstance(frames[0], zmq.Frame) else frames[0]
    msg = decode(head)
    if len(frames) == 1:
        return msg
    if len(frames) != 2 or not isinstance(msg, PDKVChunk) or msg.payload:
        raise ValueError(f"{type(msg).__name__} in {len(frames)} frames")
    body = frames[1]
    msg.payload = body.buffer if isinstance(body, zmq.Frame) else body
    return msg


class _Link:
    """The shared thread loop; subclasses own the sockets."""

    def __init__(self, heartbeat_timeout: float):
        self.ping_every = max(heartbeat_timeout / 5, 0.01)
        self._ctx = zmq.Context()
        self._out: queue.Queue[tuple[Any, list[bytes]]] = queue.Queue()
        self._in: deque[tuple[Any, Any, int]] = deque()  # (peer, message, its K/V payload bytes), oldest first
        self._in_lock = threading.Lock()
        self.in_bytes = 0  # sum of _in's payload bytes
        self._taken = threading.Event()  # set by receive(): a throttled link may read again
        self._seen: dict[Any, float] = {}  # peer -> time.monotonic() of its last message (or of our first send)
        self._stop = threading.Event()
        self.sent_bytes = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, peer: Hashable, msg: Any) -> None:
        self._out.put((peer, to_frames(msg)))

    def receive(self, max_bytes: Optional[int] = None) -> list[tuple[Any, Any]]:
        """What arrived, oldest first: everything, or with max_bytes messages up to that many K/V payload bytes
        (at least one message; the rest stays for the next call, in order)."""
        out: list[tuple[Any, Any]] = []
        taken = 0
        with self._in_lock:
            while self._in:
                peer, msg, n = self._in[0]
                if out and max_bytes is not None and taken + n > max_bytes:
                    break
                self._in.popleft()
                out.append((peer, msg))
                taken += n
            self.in_bytes -= taken
        if taken:
            self._taken.set()
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
                peer, frames = self._out.get_nowait()
            except queue.Empty:
                return
            self._seen.setdefault(peer, time.monotonic())
            try:
                self._send_raw(peer, frames)
                self.sent_bytes += sum(len(f) for f in frames)
            except zmq.Again:
                self.dropped += 1

    def _note(self, peer: Any, frames: list[Any]) -> None:
        self._seen[peer] = time.monotonic()
        try:
            msg = from_frames(frames)
        except Exception:  # noqa: BLE001 - a malformed message is dropped, never fatal
            logger.warning("PD link: undecodable message from %r dropped", peer)
            return
        if isinstance(msg, PDPing):
            self._send_raw(peer, [encode(PDPong(msg.seq))])
        elif not isinstance(msg, PDPong):
            n = len(msg.payload) if isinstance(msg, PDKVChunk) else 0
            with self._in_lock:
                self._in.append((peer, msg, n))
                self.in_bytes += n

    # subclass hooks
    def _setup(self) -> None: ...
    def _teardown(self) -> None: ...
    def _ping(self) -> None: ...
    def _poll_in(self) -> None: ...
    def _send_raw(self, peer: Any, frames: list[bytes]) -> None: ...


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
                    peer, *frames = self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    return
                if frames:
                    self._note(peer.bytes, frames)

    def _send_raw(self, peer: Any, frames: list[bytes]) -> None:
        self.sock.send_multipart([peer, *frames], flags=zmq.NOBLOCK, copy=False)

    def _teardown(self) -> None:
        self.sock.close(linger=0)
        self._ctx.term()


class BootstrapClient(_Link):
    """Decode side: a DEALER per prefill (peer = (host, port)), created at the first send to it."""

    def __init__(self, heartbeat_timeout: float, max_buffered: int = MAX_BUFFERED):
        super().__init__(heartbeat_timeout)
        self.max_buffered = max_buffered
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
            s.setsockopt(zmq.RCVHWM, CLIENT_RCVHWM)
            s.setsockopt(zmq.RECONNECT_IVL, 100)
            s.connect(f"tcp://{host}:{port}")
            self.socks[peer] = s
            self._poller.register(s, zmq.POLLIN)
        return s

    def _send_raw(self, peer: Any, frames: list[bytes]) -> None:
        self._sock(peer).send_multipart(frames, flags=zmq.NOBLOCK, copy=False)

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
        if self.in_bytes >= self.max_buffered:  # throttled: wait (bounded) for the scheduler to take some
            self._taken.clear()
            if self.in_bytes >= self.max_buffered:
                self._taken.wait(POLL_S)
        ready = dict(self._poller.poll(0 if self.in_bytes >= self.max_buffered else int(POLL_S * 1000)))
        for peer, s in list(self.socks.items()):
            if s not in ready:
                continue
            if self.in_bytes >= self.max_buffered:
                self._seen[peer] = time.monotonic()  # data waits there: the peer is alive
                continue
            while self.in_bytes < self.max_buffered:
                try:
                    frames = s.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._note(peer, frames)

    def _teardown(self) -> None:
        for s in self.socks.values():
            s.close(linger=0)
        self._ctx.term()
