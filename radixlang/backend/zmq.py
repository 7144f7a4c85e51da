"""ZmqBackend: the native protocol over the server's ZeroMQ frontend socket
(`RuntimeEndpoint("tcp://host:port")`), msgpack messages FrontendReq / FrontendOut from
radixlang_runtime/protocol/messages.py: no HTTP hop, no JSON.

Threads: one I/O thread owns the DEALER socket. Callers (program workers, any number) hand their
encoded requests to it through an inproc PUSH socket guarded by a lock, and wait on a per-request
queue. Invariants:
- every wait is bounded: a reply within `timeout`, and a heartbeat — the I/O thread pings at once,
  then every second and, when nothing at all arrived for `dead_after` seconds while requests wait,
  fails them all with BackendError (server killed, network gone) instead of waiting; those seconds are
  the I/O thread's awake time (liveness.SilenceClock), so a client starved of CPU does not blame the server;
- before the first answer the bound is `connect_timeout` (3 s): an address where no server listens
  fails within it, "no radixlang server answers at <address>", not as a server that went away;
- what arrives is decoded defensively: anything but a FrontendOut is ignored (and is no answer);
- a stream the consumer leaves early sends an abort for its request;
- stream events carry text and output_ids as deltas (frontend_zmq.py); NativeBackend.generate_stream
  passes them on as they come.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import uuid
from typing import Any, Iterator, Optional

from radixlang.backend.native import NativeBackend
from radixlang.errors import BackendError
from radixlang.global_config import global_config
from radixlang_runtime.utils.liveness import SilenceClock

PING_EVERY_S = 1.0
POLL_S = 0.2  # the I/O thread's poll: it pings, forwards and checks the server's silence this often
_SERVER = "server"  # the one peer of the SilenceClock
CONNECT_TIMEOUT_S = 3.0  # the first ping's bound (a server answers pings from its event loop, at once)


class ZmqLink:
    """Request / reply and request / stream over one DEALER socket."""

    def __init__(self, address: str, api_key: Optional[str], timeout: float, dead_after: float = 5.0,
                 connect_timeout: float = CONNECT_TIMEOUT_S):
        import zmq

        from radixlang_runtime.protocol import messages

        self._zmq, self._msgs = zmq, messages
        self.address, self.api_key, self.timeout, self.dead_after = address, api_key, timeout, dead_after
        self.connect_timeout = min(connect_timeout, dead_after)
        self._ctx = zmq.Context()
        self._inproc = f"inproc://radixlang-{uuid.uuid4().hex}"
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.bind(self._inproc)
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.connect(self._inproc)
        self._push_lock = threading.Lock()
        self._waiters: dict[str, queue.Queue] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._io_loop, daemon=True, name="radixlang-zmq")
        self._thread.start()

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._thread.join(timeout=5)

    # ------------------------------------------------------------------ callers
    def _send(self, req_id: str, method: str, body: Any) -> None:
        data = self._msgs.encode(self._msgs.FrontendReq(req_id, method, body, self.api_key))
        with self._push_lock:
            self._push.send(data)

    def open(self, method: str, body: Any = None) -> tuple[str, queue.Queue]:
        if self._closed.is_set():
            raise BackendError(f"the ZeroMQ link to {self.address} is closed")
        req_id = f"{self._prefix}-{next(self._ids)}"
        q: queue.Queue = queue.Queue()
        with self._lock:
            self._waiters[req_id] = q
        self._send(req_id, method, body)
        return req_id, q

    def next_reply(self, req_id: str, q: queue.Queue) -> Any:
        try:
            out = q.get(timeout=self.timeout)
        except queue.Empty:
            raise BackendError(f"no reply from {self.address} within {self.timeout:.0f} s") from None
        if isinstance(out, BaseException):
            raise out
        return out

    def forget(self, req_id: str) -> None:
        with self._lock:
            self._waiters.pop(req_id, None)

    def call(self, method: str, body: Any = None) -> Any:
        req_id, q = self.open(method, body)
        try:
            out = self.next_reply(req_id, q)
        finally:
            self.forget(req_id)
        _check(out, method)
        return out.body

    def stream(self, method: str, body: Any) -> Iterator[Any]:
        req_id, q = self.open(method, body)
        done = False
        try:
            while True:
                out = self.next_reply(req_id, q)
                _check(out, method)
                if out.done:
                    done = True
                    return
                yield out.body
        finally:
            self.forget(req_id)
            if not done and not self._closed.is_set():
                self._send(f"{req_id}-abort", "abort", {"req_id": req_id})

    # ------------------------------------------------------------------ the I/O thread
    def _io_loop(self) -> None:
        zmq = self._zmq
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        # no receive high-water mark: libzmq's I/O thread keeps taking a long stream's events off the wire
        # while this thread is slow (the server's ROUTER drops, silently, what a full pipe cannot take)
        dealer.setsockopt(zmq.RCVHWM, 0)
        if self.address.startswith("tcp://["):  # an IPv6 host (discover.py brackets it)
            dealer.setsockopt(zmq.IPV6, 1)
        dealer.connect(self.address)
        poller = zmq.Poller()
        poller.register(dealer, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        # the server's silence over this thread's awake time: a client starved of CPU does not blame the server
        silence = SilenceClock(max_step=4 * POLL_S)
        silence.heard(_SERVER)
        last_ping = time.monotonic() - PING_EVERY_S  # the first ping goes out at once
        heard = False  # anything from the server yet (before that, the bound is connect_timeout)
        try:
            while not self._closed.is_set():
                events = dict(poller.poll(int(POLL_S * 1000)))
                now = time.monotonic()
                silence.tick(now)
                if self._pull in events:
                    while self._pull.poll(0):
                        dealer.send(self._pull.recv())
                if dealer in events:
                    while dealer.poll(0):
                        if self._deliver(dealer.recv()):
                            silence.heard(_SERVER)
                            heard = True
                if now - last_ping >= PING_EVERY_S:
                    dealer.send(self._msgs.encode(self._msgs.FrontendReq("ping", "ping", None, self.api_key)))
                    last_ping = now
                with self._lock:
                    waiting = bool(self._waiters)
                bound = self.dead_after if heard else self.connect_timeout
                if not waiting:
                    silence.cap(_SERVER, bound / 2)
                elif silence.silence(_SERVER) > bound:
                    self._fail_all(self._silence(heard))
                    silence.heard(_SERVER)
        finally:
            self._fail_all(BackendError(f"the ZeroMQ link to {self.address} was closed"))
            dealer.close(0)
            self._pull.close(0)
            self._push.close(0)
            self._ctx.term()

    def _silence(self, heard: bool) -> BackendError:
        if heard:
            return BackendError(f"the server at {self.address} stopped answering "
                                f"(nothing for {self.dead_after:.0f} s): connection lost", 503)
        return BackendError(f"no radixlang server answers at {self.address} (nothing within "
                            f"{self.connect_timeout:.0f} s of connecting): is it running, and not with "
                            "--frontend-port -1?", 503)

    def _deliver(self, data: bytes) -> bool:
        """Hand a reply to its waiter; False for anything that is not a FrontendOut (ignored)."""
        try:
            out = self._msgs.decode(data)
        except Exception:
            return False
        if not isinstance(out, self._msgs.FrontendOut) or not isinstance(out.req_id, str):
            return False
        with self._lock:
            q = self._waiters.get(out.req_id)
        if q is not None:
            q.put(out)
        return True

    def _fail_all(self, err: BaseException) -> None:
        with self._lock:
            waiters = list(self._waiters.values())
        for q in waiters:
            q.put(err)


def _check(out: Any, method: str) -> None:
    if out.status != 200:
        body = out.body
        msg = body.get("error", {}).get("message", body) if isinstance(body, dict) else body
        raise BackendError(f"{method} answered {out.status}: {msg}", out.status)


class ZmqBackend(NativeBackend):
    transport = "zmq"
    stream_text_deltas = True  # the frontend streams text deltas: O(1) bytes a token, not the text so far
    http_url: Optional[str] = None  # the http(s) URL this link was found through (discover.py), if any

    def __init__(self, address: str, api_key: Optional[str] = None, chat_template_name: Optional[str] = None,
                 timeout: Optional[float] = None, dead_after: float = 5.0, connect_timeout: float = CONNECT_TIMEOUT_S):
        self.base_url = address
        self.api_key = api_key
        self.link = ZmqLink(address, api_key, timeout or global_config.request_timeout, dead_after, connect_timeout)
        try:
            super().__init__(chat_template_name)
        except BaseException:
            self.link.close()
            raise

    def _call(self, body: dict) -> Any:
        return self.link.call("generate", body)

    def _call_stream(self, body: dict) -> Iterator[dict]:
        return self.link.stream("generate", body)

    def _control(self, method: str, body: Optional[dict] = None) -> Any:
        return self.link.call(method, body)

    def shutdown(self) -> None:
        self.link.close()

    def __del__(self) -> None:
        link = self.__dict__.get("link")
        if link is not None:
            link._closed.set()
