"""FrontendSocket: the DSL link's ROUTER socket on a thread of its own, so no message (nor a flood of them)
is read, checked or decoded on the HTTP event loop.

The thread owns the socket (ZeroMQ sockets belong to one thread): it reads, hands each message to
`admit` (frontend_zmq.FrontendServer._admit: the checks cheapest first, the rate limits, the pings'
answers, all on this thread) and queues what admit returns for the event loop, at most MAX_INBOX
items (beyond: `on_full(item)`, which answers or drops it); the loop is woken once per batch
(call_soon_threadsafe), never per message. It sends what `send` queued (the loop's replies) and what
admit answered at once; a socket pair wakes it when the loop queues a reply.

A flood costs this thread, not the loop: it reads at most READ_PER_WINDOW messages every WINDOW_S
(READ_PER_WINDOW / WINDOW_S a second, every peer together); past that it waits out the window, the rest
waits in ZeroMQ's queues and TCP pushes back on the senders, so its share of the interpreter (the GIL
it shares with HTTP) stays bounded. The thread's loop restarts after an exception; one that fails
MAX_RESTARTS times within RESTART_WINDOW_S stops and `problem` names it (/health 503).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from typing import Any, Callable, Optional

import zmq

from radixlang_runtime.utils.restart_budget import RestartBudget

logger = logging.getLogger(__name__)
POLL_MS = 50  # the thread's poll timeout (a stop is seen within it)
MAX_INBOX = 4096  # admitted messages waiting for the event loop
WINDOW_S, READ_PER_WINDOW = 0.05, 500  # at most 10,000 messages read a second
MAX_RESTARTS, RESTART_WINDOW_S = 5, 60.0


class FrontendSocket:
    def __init__(self, address: str, max_frame_bytes: int, admit: Callable[[list], Optional[Any]],
                 on_full: Callable[[Any], None]):
        self._admit, self._on_full = admit, on_full
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
        if address.startswith("tcp://["):
            self._sock.setsockopt(zmq.IPV6, 1)
        self._sock.bind(address)
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)  # the port a `*` picked
        self._inbox: deque = deque()
        self._outbox: deque[list] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._wake_pending = False  # a wake byte is on its way (the loop writes at most one between reads)
        self._notify: Optional[Callable[[], None]] = None
        self._notified = False  # the loop was told and has not taken yet
        self._stop = threading.Event()
        self._budget = RestartBudget(MAX_RESTARTS, RESTART_WINDOW_S)
        self.restarts = 0
        self.problem: Optional[str] = None
        self._thread = threading.Thread(target=self._run, name="frontend-socket", daemon=True)

    # ------------------------------------------------------------------ the event loop's side
    def start(self, notify: Callable[[], None]) -> None:
        """notify: called on this thread when the inbox gets items (it must only schedule work on the loop)."""
        self._notify = notify
        self._thread.start()

    def take(self, most: int) -> list:
        """Up to `most` admitted items, oldest first."""
        self._notified = False
        out = []
        while self._inbox and len(out) < most:
            out.append(self._inbox.popleft())
        return out

    def send(self, frames: list) -> None:
        """Queue [ident, data] for the socket (any thread); the thread sends it at its next turn."""
        self._outbox.append(frames)
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self._wake_w.send(b"x")
            except (BlockingIOError, OSError):
                pass  # a full pipe wakes it anyway

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        if not self._thread.is_alive():
            self._sock.close(0)
            self._ctx.term()
        self._wake_r.close()
        self._wake_w.close()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r.fileno(), zmq.POLLIN)
        while not self._stop.is_set():
            try:
                self._loop(poller)
            except Exception as e:  # noqa: BLE001 - restarted, or named by `problem` (never silent)
                if not self._budget.allow():
                    self.problem = (f"the ZeroMQ frontend's socket thread failed {MAX_RESTARTS + 1} times within "
                                    f"{RESTART_WINDOW_S:.0f} s (last: {e!r})")
                    logger.error("%s", self.problem, exc_info=e)
                    return
                self.restarts += 1
                logger.error("frontend socket thread failed (%r); restarting its loop", e, exc_info=e)
        self._flush()  # the last replies (a drain's) go out before the socket closes

    def _loop(self, poller: zmq.Poller) -> None:
        window_start, read = time.monotonic(), 0
        while not self._stop.is_set():
            events = dict(poller.poll(POLL_MS))
            if self._wake_r.fileno() in events:
                self._drain_wake()
            self._flush()
            if self._sock not in events:
                continue
            now = time.monotonic()
            if now - window_start >= WINDOW_S:
                window_start, read = now, 0
            while read < READ_PER_WINDOW:
                try:
                    frames = self._sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                read += 1
                item = self._admit(frames)
                if item is not None:
                    self._queue(item)
            self._flush()  # the answers admit gave (pings, refusals)
            if read >= READ_PER_WINDOW:  # the window's reads are spent: the rest waits in the socket
                time.sleep(max(0.0, window_start + WINDOW_S - time.monotonic()))

    def _queue(self, item: Any) -> None:
        if len(self._inbox) >= MAX_INBOX:
            self._on_full(item)
            return
        self._inbox.append(item)
        if not self._notified and self._notify is not None:
            self._notified = True
            self._notify()

    def _drain_wake(self) -> None:
        self._wake_pending = False
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _flush(self) -> None:
        while self._outbox:
            frames = self._outbox.popleft()
            try:
                self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.ZMQError as e:  # a peer gone or its queue full: that reply only
                logger.warning("frontend socket: a reply was not delivered: %s", e)
