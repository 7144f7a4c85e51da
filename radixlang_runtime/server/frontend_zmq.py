"""The server side of the DSL's ZeroMQ link: a ROUTER socket next to HTTP, feeding the HTTP process's
TokenizerManager (so both links share one request path). The socket lives on a thread of its own
(server/frontend_socket.py): every message is read, checked, rate-limited and decoded there, pings are
answered there, and the event loop only serves the requests that passed, a batch at a time
(docs/DSL_LINK.md), so a flood on the port never holds HTTP.

Messages are FrontendReq / FrontendOut (messages.py, msgpack). A `generate` body is the native
/generate JSON body, parsed by the one intake (services.intake_generate); replies carry the same result dicts
(a stream: one FrontendOut per snapshot, text / output_ids / logprobs as deltas, "text_trim" in a final
one whose stop string was cut, then done=True: bytes grow linearly with the tokens; a plain reply: the
whole text).
Every method calls the service functions the HTTP handlers call (services.py: the same intake, the
same model_info / server_info / flush_cache / pins), so both links answer alike. Invariants:
- the --api-key rule is HTTP's: every method but ping needs the key (401 otherwise);
- a client that stops pinging for CLIENT_TIMEOUT_S loses its requests (aborted, KV freed) and pins; the
  silence is counted over this server's awake time (liveness.SilenceClock): a stalled event loop does not
  drop the clients whose pings wait in the socket;
- one task hands the replies to the socket thread (a queue), the receive loop never awaits a request.

Anyone who reaches the port can send anything; nothing they send stops the link or holds HTTP:
- libzmq refuses a frame over MAX_FRAME_BYTES (zmq.MAXMSGSIZE: it disconnects that peer instead of
  buffering the frame). The largest real message is a long prompt: ~3-5 bytes a token id (a
  128K-token prompt of ids ~640 KB, as text ~1 MB), a batch of them a few MB; 64 MiB is ample.
- a message is [ident, data] (the ROUTER prepends ident to the DEALER's one frame); any other
  frame count is dropped.
- the key is checked before anything large is decoded (link_key.LinkKey, the PD link's mechanism
  too). It travels inside the msgpack body, as FrontendReq's last field, so a message that carries
  key K ends with K's msgpack string (the smallest form, which msgpack and messages.encode write):
  that tail is compared (hmac.compare_digest) before decoding. A message without it is decoded only up to
  OPEN_MSG_BYTES (a ping, or a request to answer 401); a larger one is dropped unread. The decoded
  api_key field is then the rule (the tail is a filter). Not chosen: the key in a frame of its
  own (a protocol change for the same comparison) and ZeroMQ's PLAIN / CURVE handshake (ZAP), which
  refuses silently where a wrong key must be a clear 401.
- rate limits, per sender (ROUTER identity): a message without the key is checked against
  OPEN_RATE / OPEN_BURST (and all of them together against OPEN_TOTAL_RATE) before it is decoded and
  dropped silently past them; one with the key against KEYED_RATE / KEYED_BURST after it, and an
  authorized sender past them is answered 429. At most MAX_INBOX messages wait for the event loop
  (frontend_socket.py); an authorized one past that is answered 503.
- decode is msgpack.unpackb, whose limits (max_str_len, max_bin_len, max_array_len, max_map_len,
  max_ext_len) default to the message's size: no header can claim more than the bytes that
  arrived, and nesting stops at msgpack's own stack (1024 levels, StackError).
- then the fields' types (str req_id and method, str or None api_key, abort's {"req_id": str}).
  A message that fails any step is dropped and counted (stats(): /server_info's "frontend", and
  radixlang:frontend_dropped_messages on /metrics); when its sender holds the key and its req_id
  is a string it is also answered 400 naming the problem. A request whose handling raises is
  answered 500 (authorized) or dropped, never the loop's end.
- a supervisor restarts a loop (recv, send, janitor) that ends with an exception; one that ends
  MAX_RESTARTS times within RESTART_WINDOW_S stays down and problem() names it: /health is 503.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter, deque
from typing import Any, Optional

from radixlang_runtime.utils.link_key import link_key
from radixlang_runtime.utils.liveness import SilenceClock
from radixlang_runtime.protocol.messages import FrontendOut, FrontendReq, decode, encode
from radixlang_runtime.utils.rate_limit import PeerRateLimit
from radixlang_runtime.utils.restart_budget import RestartBudget
from radixlang_runtime.server import services
from radixlang_runtime.server.frontend_socket import FrontendSocket
from radixlang_runtime.server.http_common import error_body

logger = logging.getLogger(__name__)
CLIENT_TIMEOUT_S = 10.0  # of this server's awake time without a message from the client (it pings every 1 s)
JANITOR_EVERY_S = 1.0
MAX_FRAME_BYTES = 64 << 20  # zmq.MAXMSGSIZE: a larger frame disconnects its sender
OPEN_MSG_BYTES = 4096  # what a message without the key may weigh to be decoded at all
MAX_RESTARTS, RESTART_WINDOW_S = 5, 60.0  # a loop failing more often than this stays down
DROP_LOG_EVERY_S = 5.0  # at most one log line per this many seconds about dropped messages
OPEN_RATE, OPEN_BURST, OPEN_TOTAL_RATE = 100.0, 200.0, 1000.0  # messages without the key: a sender's, everyone's
KEYED_RATE, KEYED_BURST = 10000.0, 20000.0  # messages with the key (every message when there is no --api-key)
BATCH = 64  # requests the event loop serves before it lets other work (HTTP) in


class _Dropped(Exception):
    """A message not served. reason: its stats key; answer_to: (ident, req_id) of an authorized
    sender to answer `status`, else None (nothing to answer, or nobody it may be told to)."""

    def __init__(self, reason: str, detail: str, answer_to: Optional[tuple[bytes, str]] = None, status: int = 400):
        super().__init__(detail)
        self.reason, self.answer_to, self.status = reason, answer_to, status


def frontend_address(host: str, port: int) -> str:
    """The link's bind address on the HTTP host: port 0 is a free one (ZeroMQ's wildcard `*`), an IPv6
    host goes in brackets (FrontendServer then enables IPv6 on its socket)."""
    where = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"tcp://{where}:{'*' if port == 0 else port}"


class FrontendServer:
    """address: where to bind (frontend_address); after __init__, `address` and `port` are what was bound."""

    def __init__(self, address: str, state: Any, tm: Any, api_key: Optional[str]):
        self.state = state  # the ServerState the HTTP handlers serve (services.py takes it)
        self.tm = tm
        self.api_key = api_key
        self._key = link_key(api_key)  # None: no key, every sender is authorized
        self._open_limit = PeerRateLimit(OPEN_RATE, OPEN_BURST, total_rate=OPEN_TOTAL_RATE)
        self._keyed_limit = PeerRateLimit(KEYED_RATE, KEYED_BURST)
        self._socket = FrontendSocket(address, MAX_FRAME_BYTES, self._admit, self._on_full)
        self.address = self._socket.address
        self.port = int(self.address.rsplit(":", 1)[1]) if address.startswith("tcp://") else None
        self._heard: deque[bytes] = deque()  # senders of pings (answered on the socket thread), for the janitor
        self._ready: Optional[asyncio.Event] = None  # set (from the socket thread) when admitted messages wait
        self._drop_lock = threading.Lock()  # drops are counted on both threads
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._tasks: dict[tuple[bytes, str], asyncio.Task] = {}
        self._pins: dict[bytes, set[str]] = {}
        self._unpinning: set[asyncio.Task] = set()
        self._silence = SilenceClock(max_step=2 * JANITOR_EVERY_S)  # clients' silence, this loop's awake time
        self._loops: dict[str, asyncio.Task] = {}
        self._restarts: dict[str, RestartBudget] = {}  # loop name -> its restarts (this window)
        self._restart_count = 0
        self._problem: Optional[str] = None
        self._closing = False
        self._dropped: Counter[str] = Counter()
        self._served: Counter[str] = Counter()  # authorized requests by method (pings not counted)
        self._drop_logged_at = -DROP_LOG_EVERY_S

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()

        def notify() -> None:  # on the socket thread
            try:
                loop.call_soon_threadsafe(self._ready.set)
            except RuntimeError:  # the loop is closed: nobody is left to serve
                pass

        for name in ("recv", "send", "janitor"):
            self._spawn(name)
        self._socket.start(notify)
        logger.info("frontend socket: %s", self.address)

    async def close(self) -> None:
        self._closing = True
        deadline = time.monotonic() + 2.0  # the drained requests' last replies go out first (bounded)
        while not self._outbox.empty() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for t in list(self._loops.values()) + list(self._tasks.values()):
            t.cancel()
        await asyncio.gather(*self._loops.values(), *self._tasks.values(), return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self._socket.close)  # joins the thread (bounded)

    def problem(self) -> Optional[str]:
        """Why the link no longer serves (a loop or the socket thread that could not be restarted), else None."""
        return self._problem or self._socket.problem

    def stats(self) -> dict[str, Any]:
        with self._drop_lock:
            dropped = dict(self._dropped)
        return {"address": self.address, "port": self.port, "requests_by_method": dict(self._served),
                "dropped_messages": sum(dropped.values()), "dropped_by_reason": dropped,
                "loop_restarts": self._restart_count + self._socket.restarts, "problem": self.problem()}

    # ------------------------------------------------------------------ supervisor
    def _spawn(self, name: str) -> None:
        body = {"recv": self._recv_loop, "send": self._send_loop, "janitor": self._janitor}[name]
        task = asyncio.get_running_loop().create_task(body(), name=f"frontend-{name}")
        self._loops[name] = task
        task.add_done_callback(lambda t: self._loop_ended(name, t))

    def _loop_ended(self, name: str, task: asyncio.Task) -> None:
        if self._closing or task.cancelled():
            return
        err = task.exception()
        budget = self._restarts.setdefault(name, RestartBudget(MAX_RESTARTS, RESTART_WINDOW_S))
        if not budget.allow():
            self._problem = (f"the ZeroMQ frontend at {self.address} is down: its {name} loop failed "
                             f"{MAX_RESTARTS + 1} times within {RESTART_WINDOW_S:.0f} s (last: {err!r})")
            logger.error("%s", self._problem, exc_info=err)
            return
        self._restart_count += 1
        logger.error("frontend socket: the %s loop ended (%r); restarting it", name, err, exc_info=err)
        try:
            self._spawn(name)
        except Exception as e:  # e.g. the event loop is closing
            self._problem = f"the ZeroMQ frontend at {self.address} is down: its {name} loop could not restart ({e!r})"
            logger.error("%s", self._problem)

    # ------------------------------------------------------------------ loops
    async def _recv_loop(self) -> None:
        """Serves what the socket thread admitted, BATCH requests at a time (HTTP runs in between)."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            while items := self._socket.take(BATCH):
                for ident, req, authorized in items:
                    try:
                        self._take(ident, req, authorized)
                    except _Dropped as d:
                        self._count_drop(d.reason, str(d))
                        if d.answer_to is not None:
                            self._reply(*d.answer_to, d.status, _err(str(d)))
                    except Exception as e:  # a fault of the taking itself: the message is lost, the loop is not
                        logger.exception("frontend socket: a message could not be taken")
                        self._count_drop("internal", repr(e))
                await asyncio.sleep(0)

    def _take(self, ident: bytes, req: FrontendReq, authorized: bool) -> None:
        self._silence.heard(ident)
        try:
            self._dispatch(ident, req, authorized)
        except _Dropped:
            raise
        except Exception as e:
            logger.exception("frontend socket: a %r request failed", req.method)
            raise _Dropped("dispatch", f"internal error: {e!r}", (ident, req.req_id) if authorized else None,
                           500) from None

    async def _send_loop(self) -> None:
        while True:
            ident, out = await self._outbox.get()
            try:
                data = encode(out)
            except Exception as e:  # a body msgpack cannot carry: the client still gets its answer
                logger.exception("frontend socket: a reply could not be encoded")
                data = encode(FrontendOut(out.req_id, 500, _err(f"internal error: unencodable reply: {e!r}")))
            self._socket.send([ident, data])

    async def _janitor(self) -> None:
        while True:
            await asyncio.sleep(JANITOR_EVERY_S)
            while self._heard:  # pings, answered on the socket thread
                self._silence.heard(self._heard.popleft())
            self._silence.tick()
            for ident in self._silence.silent_peers(CLIENT_TIMEOUT_S):
                self._forget_client(ident)

    def _forget_client(self, ident: bytes) -> None:
        self._silence.forget(ident)
        for key, task in list(self._tasks.items()):
            if key[0] == ident:
                task.cancel()  # tm.generate's finally aborts the request
        for pin_id in self._pins.pop(ident, set()):
            task = asyncio.get_running_loop().create_task(self._unpin(pin_id))
            self._unpinning.add(task)  # a strong reference until it is done
            task.add_done_callback(self._unpinning.discard)

    def _reply(self, ident: bytes, req_id: str, status: int, body: Any = None, done: bool = True) -> None:
        self._outbox.put_nowait((ident, FrontendOut(req_id, status, body, done)))

    # ------------------------------------------------------------------ the socket thread's part
    def _admit(self, frames: list) -> Optional[tuple[bytes, FrontendReq, bool]]:
        """On the socket thread: a message checked (_parse); a ping answered here; what the event loop must
        serve returned (None: nothing, it was answered or dropped)."""
        try:
            ident, req, authorized = self._parse(frames)
        except _Dropped as d:
            self._count_drop(d.reason, str(d))
            if d.answer_to is not None:
                self._answer_now(*d.answer_to, d.status, _err(str(d)))
            return None
        if req.method == "ping":
            self._heard.append(ident)
            self._answer_now(ident, req.req_id, 200, "pong")
            return None
        return ident, req, authorized

    def _on_full(self, item: tuple[bytes, FrontendReq, bool]) -> None:
        """On the socket thread: MAX_INBOX messages wait for the event loop; this one is not served."""
        ident, req, authorized = item
        self._count_drop("queue_full", "the event loop's queue is full")
        if authorized:
            self._answer_now(ident, req.req_id, 503, _err("the ZeroMQ frontend is busy: try again"))

    def _answer_now(self, ident: bytes, req_id: str, status: int, body: Any) -> None:
        self._socket.send([ident, encode(FrontendOut(req_id, status, body))])

    def _parse(self, frames: list) -> tuple[bytes, FrontendReq, bool]:
        """[ident, data] -> (ident, request, whether its sender holds the key); raises _Dropped. Cheapest
        first: the frame count, the size and the key's tail, the rate of unkeyed senders, then msgpack."""
        if len(frames) != 2:
            raise _Dropped("frames", f"a message of {len(frames) - 1} frames (expected 1)")
        ident, data = frames[0].bytes, frames[1].buffer
        keyed = self._key is None or self._key.ends_with_key(data)
        if not keyed and len(data) > OPEN_MSG_BYTES:
            raise _Dropped("size", f"{len(data)} bytes without the key (at most {OPEN_MSG_BYTES} are read)")
        if not keyed and not self._open_limit.allow(ident):
            raise _Dropped("rate", "a sender without the key over its message rate")
        try:
            req = decode(data)
        except Exception as e:
            raise _Dropped("decode", f"not a message: {e!r}") from None
        if not isinstance(req, FrontendReq):
            raise _Dropped("type", f"expected a FrontendReq, got {type(req).__name__}")
        authorized = keyed and (self._key is None or self._key.holds(req.api_key))
        answerable = authorized and isinstance(req.req_id, str)
        problem = _shape_problem(req)
        if problem is not None:
            raise _Dropped("shape", problem, (ident, req.req_id) if answerable else None)
        if keyed and not self._keyed_limit.allow(ident):
            raise _Dropped("rate", f"over {KEYED_RATE:g} messages a second", (ident, req.req_id) if answerable
                           else None, 429)
        return ident, req, authorized

    def _count_drop(self, reason: str, detail: str) -> None:
        with self._drop_lock:
            self._dropped[reason] += 1
            total = sum(self._dropped.values())
        metrics = getattr(self.tm, "metrics", None)
        if metrics is not None:
            metrics.frontend_dropped_messages.inc()
        now = time.monotonic()
        if now - self._drop_logged_at >= DROP_LOG_EVERY_S:  # a flood of them is not a flood of log lines
            self._drop_logged_at = now
            logger.warning("frontend socket: dropped a message (%s: %s); %d dropped so far", reason, detail[:200],
                           total)

    # ------------------------------------------------------------------ requests
    def _dispatch(self, ident: bytes, req: FrontendReq, authorized: bool) -> None:
        if req.method == "ping":
            self._reply(ident, req.req_id, 200, "pong")
            return
        if not authorized:
            self._reply(ident, req.req_id, 401, _err("invalid or missing API key"))
            return
        self._served[req.method if req.method in _METHODS else "unknown"] += 1  # bounded: a key per method
        if req.method == "abort":  # body checked by _shape_problem
            task = self._tasks.get((ident, req.body["req_id"]))
            if task is not None:
                task.cancel()
            return
        key = (ident, req.req_id)
        if key in self._tasks:  # the first one keeps its id (and its abort)
            raise _Dropped("duplicate", f"req_id {req.req_id!r} is already in flight", key)
        task = asyncio.get_running_loop().create_task(self._handle(ident, req))
        self._tasks[key] = task
        task.add_done_callback(lambda _t: self._tasks.pop(key, None))

    async def _handle(self, ident: bytes, req: FrontendReq) -> None:
        from radixlang_runtime.server.lifecycle import RuntimeUnavailable, ShuttingDown

        try:
            if req.method == "generate":
                await self._generate(ident, req)
            elif req.method in _CONTROL:
                status, body = await _CONTROL[req.method](self.state)
                self._reply(ident, req.req_id, status, body)
            elif req.method == "concate_and_append":
                self._reply(ident, req.req_id, 200, {})  # texts are joined client-side; the radix cache shares KV
            elif req.method in ("pin_prefix", "unpin_prefix"):
                await self._pin(ident, req)
            else:
                self._reply(ident, req.req_id, 404, _err(f"unknown method {req.method!r}"))
        except asyncio.CancelledError:
            raise
        except ShuttingDown as e:  # draining: the same message as HTTP's 503
            self._reply(ident, req.req_id, 503, _err(str(e)))
        except RuntimeUnavailable as e:
            self._reply(ident, req.req_id, 503, _err(f"the runtime is unavailable: {e}"))
        except ValueError as e:
            self._reply(ident, req.req_id, 400, _err(str(e)))
        except Exception as e:  # never a hang: the client gets the failure
            logger.exception("frontend request failed")
            self._reply(ident, req.req_id, 500, _err(f"internal error: {e!r}"))

    async def _generate(self, ident: bytes, req: FrontendReq) -> None:
        """The /generate service (services.py), as the HTTP handler calls it."""
        reqs, as_list = await services.intake_generate(self.state, req.body)
        if reqs[0].stream:
            async for out in services.generate_events(services.generate_streams(self.state, reqs), as_list):
                self._reply(ident, req.req_id, 200, out, done=False)
            self._reply(ident, req.req_id, 200, None, done=True)
            return
        results = await services.generate_finals(self.state, reqs)
        self._reply(ident, req.req_id, 200, results if as_list else results[0])

    async def _pin(self, ident: bytes, req: FrontendReq) -> None:
        """/pin_prefix and /unpin_prefix's bodies and answers. The client is watched (heartbeat), so a
        pin has no ttl unless the body gives one: it ends with the client (_forget_client)."""
        body = req.body or {}
        if req.method == "pin_prefix":
            out = await services.pin_prefix(self.tm, body, None, services.pin_owner(self.api_key))
            self._pins.setdefault(ident, set()).add(out["pin_id"])
            self._reply(ident, req.req_id, 200, out)
        else:
            pin_id = services.pin_id_of(body)
            self._pins.get(ident, set()).discard(pin_id)
            self._reply(ident, req.req_id, 200, await services.unpin_prefix(self.tm, pin_id,
                                                                            services.pin_owner(self.api_key)))

    async def _unpin(self, pin_id: Any) -> None:
        try:
            await self.tm.unpin_prefix(pin_id, services.pin_owner(self.api_key))
        except Exception as e:
            logger.warning("unpin %s failed: %s", pin_id, e)


def _shape_problem(req: FrontendReq) -> Optional[str]:
    """What is wrong with a decoded request's field types, or None."""
    if not isinstance(req.req_id, str):
        return "req_id must be a string"
    if not isinstance(req.method, str):
        return "method must be a string"
    if req.api_key is not None and not isinstance(req.api_key, str):
        return "api_key must be a string or null"
    if req.method == "abort" and not (isinstance(req.body, dict) and isinstance(req.body.get("req_id"), str)):
        return 'abort needs the body {"req_id": "..."}'
    return None


def _err(message: str) -> dict:
    return {"error": {"message": message}}


async def _model_info(state: Any) -> tuple[int, Any]:
    return 200, services.model_info(state)


async def _server_info(state: Any) -> tuple[int, Any]:
    return 200, await services.server_info(state)


async def _flush_cache(state: Any) -> tuple[int, Any]:
    if await services.flush_cache(state):
        return 200, services.FLUSHED
    return 400, error_body(400, services.NOT_FLUSHED)


# control methods -> their service, answered (status, body) as /get_model_info, /server_info, /flush_cache are
_CONTROL = {"model_info": _model_info, "server_info": _server_info, "flush_cache": _flush_cache}
_METHODS = {"generate", "abort", "concate_and_append", "pin_prefix", "unpin_prefix", *_CONTROL}
