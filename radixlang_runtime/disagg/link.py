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

Strangers (docs/DISAGGREGATION.md, "Security"): every received message passes wire.py's checks, cheapest
first (frame count and sizes, the --disaggregation-secret tag, msgpack, the fields) before the roles see it,
and the small messages (all but PDKVChunk) pass a per-peer rate limit (PEER_RATE); the roles' queue holds at
most MAX_QUEUED messages. A message that fails is dropped and counted by reason (`dropped_in`), and a peer
counts as heard from only by a message that passed. A peer address ZeroMQ cannot connect to costs its
message, never the thread; `forget(peer)` closes a peer's socket (the decode's role forgets the peers it no
longer needs). The thread's loop restarts after an exception; one that fails MAX_RESTARTS times within
RESTART_WINDOW_S stops and `problem` names it (the roles then raise FatalFault: the server exits, /health
is 503, never a silently dead link).

Invariant: every wait here is bounded (poll timeouts of POLL_S; close joins the thread for <= 2 s).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, deque
from typing import Any, Hashable, Optional

import zmq

from radixlang_runtime.disagg.wire import MAX_HEADER_BYTES, MAX_PAYLOAD_BYTES, WireError, from_frames, to_frames
from radixlang_runtime.utils.link_key import LinkKey
from radixlang_runtime.protocol.messages import PDKVChunk, PDPing, PDPong
from radixlang_runtime.utils.rate_limit import PeerRateLimit
from radixlang_runtime.utils.restart_budget import RestartBudget

logger = logging.getLogger(__name__)
POLL_S = 0.02  # the thread's poll timeout: the latency of a queued send
HWM = 10_000  # messages queued per peer before sends to it are dropped
CLIENT_RCVHWM = 4  # messages a decode's socket takes in ahead of its link thread (the rest stays in TCP)
MAX_BUFFERED = 2 << 20  # K/V payload bytes a decode's link holds for its scheduler before it stops reading
MAX_QUEUED = 65536  # messages waiting for the scheduler's receive (beyond: dropped, counted)
PEER_RATE, PEER_BURST = 5000.0, 10000.0  # small messages (not K/V) a second from one peer, and saved up
MAX_RESTARTS, RESTART_WINDOW_S = 5, 60.0  # the thread's loop failing more often than this stays down
__all__ = ["BootstrapClient", "BootstrapServer", "from_frames", "to_frames"]


class _Link:
    """The shared thread loop; subclasses own the sockets. key: the --disaggregation-secret (None: none)."""

    def __init__(self, heartbeat_timeout: float, key: Optional[LinkKey] = None):
        self.ping_every = max(heartbeat_timeout / 5, 0.01)
        self.key = key
        self._ctx = zmq.Context()
        self._out: queue.Queue[tuple[Any, Optional[list[bytes]]]] = queue.Queue()  # frames None: forget the peer
        self._in: deque[tuple[Any, Any, int]] = deque()  # (peer, message, its K/V payload bytes), oldest first
        self._in_lock = threading.Lock()
        self.in_bytes = 0  # sum of _in's payload bytes
        self._taken = threading.Event()  # set by receive(): a throttled link may read again
        self._seen: dict[Any, float] = {}  # peer -> time.monotonic() of its last message (or of our first send)
        self._limit = PeerRateLimit(PEER_RATE, PEER_BURST)
        self._stop = threading.Event()
        self.sent_bytes = 0
        self.dropped = 0  # sends dropped (a full peer queue, an address that cannot be connected to)
        self.dropped_in: Counter[str] = Counter()  # received messages dropped, by reason
        self.restarts = 0
        self.problem: Optional[str] = None  # why the thread stopped for good (the roles raise it)
        self._budget = RestartBudget(MAX_RESTARTS, RESTART_WINDOW_S)
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, peer: Hashable, msg: Any) -> None:
        self._out.put((peer, to_frames(msg, self.key)))

    def forget(self, peer: Hashable) -> None:
        """Close peer's socket once what was sent to it before is handed to ZeroMQ (decode side)."""
        self._out.put((peer, None))

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

    def stats(self) -> dict[str, Any]:
        return {"dropped_messages": sum(self.dropped_in.values()), "dropped_by_reason": dict(self.dropped_in),
                "dropped_sends": self.dropped, "link_restarts": self.restarts, "link_problem": self.problem}

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        try:
            self._setup()
            while not self._stop.is_set():
                try:
                    self._loop()
                except Exception as e:  # noqa: BLE001 - restarted, or named by `problem` (never silent)
                    if not self._restart(e):
                        return
        finally:
            self._teardown()

    def _restart(self, err: Exception) -> bool:
        if not self._budget.allow():
            self.problem = (f"the PD link thread failed {MAX_RESTARTS + 1} times within "
                            f"{RESTART_WINDOW_S:.0f} s (last: {err!r})")
            logger.error("%s", self.problem, exc_info=err)
            return False
        self.restarts += 1
        logger.error("PD link thread failed (%r); restarting its loop", err, exc_info=err)
        time.sleep(POLL_S)
        return True

    def _loop(self) -> None:
        last_ping = 0.0
        while not self._stop.is_set():
            self._flush_out()
            now = time.monotonic()
            if now - last_ping >= self.ping_every:
                last_ping = now
                self._ping()
            self._poll_in()

    def _flush_out(self) -> None:
        while True:
            try:
                peer, frames = self._out.get_nowait()
            except queue.Empty:
                return
            if frames is None:
                self._close_peer(peer)
                continue
            self._seen.setdefault(peer, time.monotonic())
            try:
                self._send_raw(peer, frames)
                self.sent_bytes += sum(len(f) for f in frames)
            except zmq.ZMQError as e:  # a full queue (EAGAIN), a peer gone, an address refused: the message only
                self.dropped += 1
                if e.errno != zmq.EAGAIN:
                    logger.warning("PD link: a message to %r was not sent: %s", peer, e)

    def _note(self, peer: Any, frames: list[Any]) -> None:
        """A received message: checked (wire.py), rate-limited when small, then queued for the roles."""
        try:
            msg = from_frames(frames, self.key)
        except WireError as e:
            self._drop(e.reason, peer, str(e))
            return
        if not isinstance(msg, PDKVChunk) and not self._limit.allow(peer):
            self._drop("rate", peer, "over the per-peer message rate")
            return
        self._seen[peer] = time.monotonic()
        if isinstance(msg, PDPing):
            self._send_raw(peer, to_frames(PDPong(msg.seq), self.key))
        elif not isinstance(msg, PDPong):
            n = len(msg.payload) if isinstance(msg, PDKVChunk) else 0
            with self._in_lock:
                if len(self._in) >= MAX_QUEUED:
                    self._drop("queue_full", peer, f"{MAX_QUEUED} messages wait for the scheduler")
                    return
                self._in.append((peer, msg, n))
                self.in_bytes += n

    def _drop(self, reason: str, peer: Any, detail: str) -> None:
        self.dropped_in[reason] += 1
        if sum(self.dropped_in.values()) in (1, 10, 100, 1000) or sum(self.dropped_in.values()) % 10000 == 0:
            logger.warning("PD link: dropped a message from %r (%s: %s); %d dropped so far", peer, reason,
                           detail[:200], sum(self.dropped_in.values()))

    # subclass hooks
    def _setup(self) -> None: ...
    def _teardown(self) -> None: ...
    def _ping(self) -> None: ...
    def _poll_in(self) -> None: ...
    def _send_raw(self, peer: Any, frames: list[bytes]) -> None: ...
    def _close_peer(self, peer: Any) -> None: ...


class BootstrapServer(_Link):
    """Prefill side: ROUTER on tcp://host:port (bound before start() returns, so a taken port fails at once)."""

    def __init__(self, host: str, port: int, heartbeat_timeout: float, key: Optional[LinkKey] = None):
        super().__init__(heartbeat_timeout, key)
        self.sock = self._ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, HWM)
        self.sock.setsockopt(zmq.RCVHWM, HWM)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_HEADER_BYTES)  # decodes send small messages only
        if ":" in host:
            self.sock.setsockopt(zmq.IPV6, 1)
        self.sock.bind(f"tcp://{_where(host)}:{port}")

    def _poll_in(self) -> None:
        if self.sock.poll(int(POLL_S * 1000)):
            while True:
                try:
                    peer, *frames = self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    return
                self._note(peer.bytes, frames)

    def _send_raw(self, peer: Any, frames: list[bytes]) -> None:
        self.sock.send_multipart([peer, *frames], flags=zmq.NOBLOCK, copy=False)

    def _teardown(self) -> None:
        self.sock.close(linger=0)
        self._ctx.term()


class BootstrapClient(_Link):
    """Decode side: a DEALER per prefill (peer = (host, port)), created at the first send to it, closed by
    forget(peer)."""

    def __init__(self, heartbeat_timeout: float, max_buffered: int = MAX_BUFFERED, key: Optional[LinkKey] = None):
        super().__init__(heartbeat_timeout, key)
        self.max_buffered = max_buffered
        self.socks: dict[Any, zmq.Socket] = {}
        self._poller = zmq.Poller()
        self._seq = 0

    def _sock(self, peer: Any) -> zmq.Socket:
        s = self.socks.get(peer)
        if s is None:
            host, port = peer
            s = self._ctx.socket(zmq.DEALER)
            try:
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.SNDHWM, HWM)
                s.setsockopt(zmq.RCVHWM, CLIENT_RCVHWM)
                s.setsockopt(zmq.RECONNECT_IVL, 100)
                s.setsockopt(zmq.MAXMSGSIZE, max(MAX_HEADER_BYTES, MAX_PAYLOAD_BYTES))
                if ":" in str(host):
                    s.setsockopt(zmq.IPV6, 1)
                s.connect(f"tcp://{_where(host)}:{port}")
            except zmq.ZMQError:
                s.close(linger=0)  # an address ZeroMQ refuses: no socket kept, the send is dropped
                raise
            self.socks[peer] = s
            self._poller.register(s, zmq.POLLIN)
        return s

    def _send_raw(self, peer: Any, frames: list[bytes]) -> None:
        self._sock(peer).send_multipart(frames, flags=zmq.NOBLOCK, copy=False)

    def _close_peer(self, peer: Any) -> None:
        s = self.socks.pop(peer, None)
        self._seen.pop(peer, None)
        if s is not None:
            self._poller.unregister(s)
            s.close(linger=200)  # what was queued to it (a PDCancel) still goes, for a bounded while

    def _ping(self) -> None:
        self._seq += 1
        ping = to_frames(PDPing(self._seq), self.key)
        for peer, s in self.socks.items():
            try:
                s.send_multipart(ping, flags=zmq.NOBLOCK)
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


def _where(host: str) -> str:
    """An IPv6 address in brackets, as ZeroMQ's tcp:// endpoints write it."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def dropped_stats(link: Any, role_dropped: Counter) -> dict[str, Any]:
    """The link's dropped messages (wire checks, rate, queue) and the role's (unmatched, refused), together."""
    link_stats = link.stats() if hasattr(link, "stats") else {}
    by = Counter(link_stats.get("dropped_by_reason", {}))
    by.update(role_dropped)
    return {"dropped_messages": sum(by.values()), "dropped_by_reason": dict(by),
            "link_restarts": link_stats.get("link_restarts", 0)}
