"""The server side of the DSL's ZeroMQ link: a ROUTER socket next to HTTP, in the HTTP process's
event loop, feeding the same TokenizerManager (so both links share one request path).

Messages are FrontendReq / FrontendOut (messages.py, msgpack). A `generate` body is the native
/generate JSON body, parsed by generate_api.parse_generate; replies carry the same result dicts
(a stream: one FrontendOut per snapshot, cumulative text and delta logprobs, then done=True).
Control methods call the HTTP app's own route functions, so /get_model_info and /server_info answer
the same on both links. Invariants:
- the --api-key rule is HTTP's: every method but ping needs the key (401 otherwise);
- a client that stops pinging for CLIENT_TIMEOUT_S loses its requests (aborted, KV freed) and pins;
- one task owns the socket's sends (a queue), the receive loop never awaits a request.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from typing import Any, Optional

import zmq
import zmq.asyncio

from radixlang_runtime.messages import FrontendOut, FrontendReq, decode, encode

logger = logging.getLogger(__name__)
CLIENT_TIMEOUT_S = 10.0
_ROUTE_OF = {"model_info": "/get_model_info", "server_info": "/server_info", "flush_cache": "/flush_cache"}


class FrontendServer:
    def __init__(self, address: str, app: Any, tm: Any, api_key: Optional[str]):
        self.address = address
        self.tm = tm
        self.api_key = api_key
        self._endpoints = {getattr(r, "path", None): getattr(r, "endpoint", None) for r in app.routes}
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(address)
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._tasks: dict[tuple[bytes, str], asyncio.Task] = {}
        self._pins: dict[bytes, set[str]] = {}
        self._unpinning: set[asyncio.Task] = set()
        self._last_seen: dict[bytes, float] = {}
        self._loops: list[asyncio.Task] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loops = [loop.create_task(f()) for f in (self._recv_loop, self._send_loop, self._janitor)]
        logger.info("frontend socket: %s", self.address)

    async def close(self) -> None:
        deadline = time.monotonic() + 2.0  # the drained requests' last replies go out first (bounded)
        while not self._outbox.empty() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for t in self._loops + list(self._tasks.values()):
            t.cancel()
        await asyncio.gather(*self._loops, *self._tasks.values(), return_exceptions=True)
        self._sock.close(0)
        self._ctx.term()

    # ------------------------------------------------------------------ loops
    async def _recv_loop(self) -> None:
        while True:
            ident, data = await self._sock.recv_multipart()
            self._last_seen[ident] = time.monotonic()
            try:
                req = decode(data)
                if not isinstance(req, FrontendReq):
                    raise ValueError(f"expected FrontendReq, got {type(req).__name__}")
            except Exception as e:  # a malformed message: nothing to answer to
                logger.warning("frontend socket: dropped a malformed message: %s", e)
                continue
            self._dispatch(ident, req)

    async def _send_loop(self) -> None:
        while True:
            ident, out = await self._outbox.get()
            await self._sock.send_multipart([ident, encode(out)])

    async def _janitor(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for ident, seen in list(self._last_seen.items()):
                if now - seen > CLIENT_TIMEOUT_S:
                    self._forget_client(ident)

    def _forget_client(self, ident: bytes) -> None:
        self._last_seen.pop(ident, None)
        for key, task in list(self._tasks.items()):
            if key[0] == ident:
                task.cancel()  # tm.generate's finally aborts the request
        for pin_id in self._pins.pop(ident, set()):
            task = asyncio.get_running_loop().create_task(self._unpin(pin_id))
            self._unpinning.add(task)  # a strong reference until it is done
            task.add_done_callback(self._unpinning.discard)

    def _reply(self, ident: bytes, req_id: str, status: int, body: Any = None, done: bool = True) -> None:
        self._outbox.put_nowait((ident, FrontendOut(req_id, status, body, done)))

    # ------------------------------------------------------------------ requests
    def _dispatch(self, ident: bytes, req: FrontendReq) -> None:
        if req.method == "ping":
            self._reply(ident, req.req_id, 200, "pong")
            return
        if self.api_key and req.api_key != self.api_key:
            self._reply(ident, req.req_id, 401, _err("invalid or missing API key"))
            return
        if req.method == "abort":
            task = self._tasks.get((ident, (req.body or {}).get("req_id")))
            if task is not None:
                task.cancel()
            return
        key = (ident, req.req_id)
        task = asyncio.get_running_loop().create_task(self._handle(ident, req))
        self._tasks[key] = task
        task.add_done_callback(lambda _t: self._tasks.pop(key, None))

    async def _handle(self, ident: bytes, req: FrontendReq) -> None:
        from radixlang_runtime.server.lifecycle import RuntimeUnavailable, ShuttingDown

        try:
            if req.method == "generate":
                await self._generate(ident, req)
            elif req.method in _ROUTE_OF:
                status, body = await self._route(_ROUTE_OF[req.method])
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
        from radixlang_runtime.server.generate_api import parse_generate
        from radixlang_runtime.server.http_common import final_result as _final, merged

        body = req.body
        items, as_list = parse_generate(self.tm, body)
        if body.get("stream"):
            gens = [self.tm.generate(ids, sp, rid, stream=True, logprob=lp) for ids, sp, rid, lp in items]
            async for i, out in merged(gens):
                if as_list:
                    out["index"] = i
                self._reply(ident, req.req_id, 200, out, done=False)
            self._reply(ident, req.req_id, 200, None, done=True)
            return
        results = await asyncio.gather(*(_final(self.tm.generate(ids, sp, rid, logprob=lp))
                                         for ids, sp, rid, lp in items))
        self._reply(ident, req.req_id, 200, results if as_list else results[0])

    async def _route(self, path: str) -> tuple[int, Any]:
        """Call the HTTP app's own handler for `path` (no Request argument) and unwrap its answer."""
        fn = self._endpoints.get(path)
        if fn is None:
            return 404, _err(f"{path} is not served")
        out = fn()
        if inspect.isawaitable(out):
            out = await out
        status = getattr(out, "status_code", None)
        if status is None:
            return 200, out
        raw = bytes(getattr(out, "body", b""))
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    async def _pin(self, ident: bytes, req: FrontendReq) -> None:
        """/pin_prefix and /unpin_prefix's bodies and answers. The client is watched (heartbeat), so a
        pin has no ttl unless the body gives one: it ends with the client (_forget_client)."""
        from radixlang_runtime.server.http_common import BadRequest, parse_pin_body

        body = req.body or {}
        if req.method == "pin_prefix":
            ids, ttl_s = parse_pin_body(self.tm, body, None)
            out = await self.tm.pin_prefix(ids, ttl_s)
            self._pins.setdefault(ident, set()).add(out["pin_id"])
            self._reply(ident, req.req_id, 200, out)
        else:
            pin_id = body.get("pin_id") if isinstance(body, dict) else None
            if not isinstance(pin_id, str):
                raise BadRequest("unpin_prefix needs {\"pin_id\": \"...\"}")
            self._pins.get(ident, set()).discard(pin_id)
            self._reply(ident, req.req_id, 200, {"pin_id": pin_id, "success": await self.tm.unpin_prefix(pin_id)})

    async def _unpin(self, pin_id: Any) -> None:
        try:
            await self.tm.unpin_prefix(pin_id)
        except Exception as e:
            logger.warning("unpin %s failed: %s", pin_id, e)


def _err(message: str) -> dict:
    return {"error": {"message": message}}
