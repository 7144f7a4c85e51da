"""The routed request: intake checks, the instances it goes to, its legs raced against failures, and
the answer (the decode's, or the worker's without --pd-disaggregation).

PD (SGLang's contract): the same body goes to one prefill and one decode instance at once, plus
bootstrap_host (the prefill's host), bootstrap_port (its bootstrap port) and bootstrap_room (a random
int in [0, 2**63), the same for both). The prefill answers with the first token only, after the decode
acknowledged the KV; the client gets the decode's answer as it is (streams: the decode's SSE relayed): the
decode carries the input logprobs itself (docs/DISAGGREGATION.md), so nothing is merged.

Failures: a leg that fails (refused, connection lost, timeout, 5xx), or an instance the request still
waits on going down (health check), answers the request at once: 502 / 503 / 504 JSON naming the
instance and why, or, once a stream's headers went out, an SSE error event then [DONE]. The other
leg is closed (the server aborts it on disconnect). An upstream 4xx passes through as it came.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, Optional

import httpx
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixlang_runtime.mem.cache_namespace import namespaced, salt_key
from radixlang_runtime.router.config import RouterArgs
from radixlang_runtime.router.health import HealthMonitor
from radixlang_runtime.router.instances import Group, Instance, NoInstance, Ticket, UpstreamError
from radixlang_runtime.router.upstream import next_chunk, open_stream, post_whole
from radixlang_runtime.protocol.limits import FieldError
from radixlang_runtime.server.http_common import SSE_DONE, BadRequest, error_body, error_response, sse

logger = logging.getLogger(__name__)
BOOTSTRAP_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


def check_pd_body(path: str, body: Any) -> None:
    """What v1 of the PD router refuses (FieldError naming the field, HTTP 400 with it as `param`): batch
    input, n > 1, and the bootstrap fields, which only the router sets."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    for name in BOOTSTRAP_FIELDS:
        if name in body:
            raise FieldError(name, f"{name} is set by the router; leave it out of the request")
    batch = "batch input (a list of prompts) is not supported with --pd-disaggregation; send one request per prompt"
    if path == "/generate":
        ids = body.get("input_ids")
        if isinstance(body.get("text"), list) or (isinstance(ids, list) and ids and isinstance(ids[0], list)):
            name = "text" if "text" in body else "input_ids"
            raise FieldError(name, f"{name}: {batch}")
        sp = body.get("sampling_params")
        if isinstance(sp, list):
            raise FieldError("sampling_params", f"sampling_params: {batch}")
        n = sp.get("n") if isinstance(sp, dict) else None
        where = "sampling_params.n"
    else:
        prompt = body.get("prompt")
        if path == "/v1/completions" and isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            raise FieldError("prompt", f"prompt: {batch}")
        n, where = body.get("n"), "n"
    if isinstance(n, int) and not isinstance(n, bool) and n > 1:
        raise FieldError(where, f"{where} = {n}: n > 1 is not supported with --pd-disaggregation; send n requests")


def routing_key(path: str, body: dict) -> list[int]:
    """The cache_aware key: the prompt's UTF-8 bytes (chat: its messages as JSON, so shared leading turns
    share a prefix), or its token ids when it gives ids; [] when there is neither. A request's cache_salt
    (SGLang's extra_key on /generate) moves the key into the salt's namespace (mem/cache_namespace.py): a salted
    prompt follows only the same salt's prompts (the workers check the field; a bad one is left to them)."""
    if path == "/generate":
        prompt = body.get("text", body.get("input_ids"))
    elif path == "/v1/completions":
        prompt = body.get("prompt")
    else:
        prompt = json.dumps(body.get("messages"), ensure_ascii=False)
    salt = body.get("cache_salt", body.get("extra_key") if path == "/generate" else None)
    salt_ns = salt_key(salt) if isinstance(salt, str) and salt else 0
    if isinstance(prompt, str):
        return namespaced(list(prompt.encode("utf-8", "backslashreplace")), salt=salt_ns)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return namespaced(prompt, salt=salt_ns)
    return []


PREFILL_GRACE_S = 1.0  # how long a finished request waits for its prefill's answer before closing that leg


class Legs:
    """A request's upstream calls and its Ticket. until(x) waits for x while failing at once when a leg
    fails or an instance the request waits on goes down. A leg that ends well stops holding its
    instance (release=True); a stream holds it until close()."""

    def __init__(self) -> None:
        self.ticket = Ticket()
        self.tasks: dict[Instance, asyncio.Task] = {}
        self.release: set[Instance] = set()

    def start(self, inst: Instance, call: Awaitable, release: bool = True) -> asyncio.Task:
        inst.tickets.add(self.ticket)
        task = self.tasks[inst] = asyncio.ensure_future(call)
        if release:
            self.release.add(inst)
        return task

    async def until(self, target: Awaitable) -> Any:
        target = asyncio.ensure_future(target)
        try:
            while True:
                pending = {t for t in self.tasks.values() if not t.done()} | {target, self.ticket.failed}
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for inst, task in self.tasks.items():
                    if task.done():
                        if task.exception() is not None:
                            raise task.exception()
                        if inst in self.release:
                            inst.tickets.discard(self.ticket)
                if self.ticket.failed.done():
                    raise self.ticket.failed.result()
                if target.done():
                    return target.result()
        finally:
            if not target.done():
                target.cancel()

    def close(self) -> None:
        for inst, task in self.tasks.items():
            inst.tickets.discard(self.ticket)
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()  # retrieved: no "never retrieved" warning


class RelayResponse(StreamingResponse):
    """The relayed SSE stream (stream_response's headers) whose `end` (release the instances' load, close
    the legs and the upstream stream) runs however the response ends: done, failed, cancelled, or the
    client gone before the first chunk, when the server may never start the body (a generator that never
    started never runs its finally) or leave it suspended at a yield until the garbage collector finds it."""

    def __init__(self, events: AsyncGenerator[bytes, None], end: Callable[[], Awaitable[None]]):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.end = end

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()  # type: ignore[attr-defined]  # a started relay runs its finally
            finally:
                await self.end()


class Dispatcher:
    """Routes each request: `prefill` is None without --pd-disaggregation (then `answer` is the workers)."""

    def __init__(self, args: RouterArgs, client: httpx.AsyncClient, health: HealthMonitor,
                 prefill: Optional[Group], answer: Group):
        self.args, self.client, self.health = args, client, health
        self.prefill, self.answer = prefill, answer
        self.requests = 0
        self.errors = 0  # requests answered with a 5xx (upstream failure or no instance)
        self.client_disconnects = 0  # non-streaming requests whose client left first (upstream legs cancelled)

    def on_client_gone(self) -> None:
        self.client_disconnects += 1

    async def handle(self, path: str, body: Any) -> Response:
        if self.prefill is not None:
            check_pd_body(path, body)
        elif not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        self.requests += 1
        rid, key = uuid.uuid4().hex, routing_key(path, body)
        chosen: list[Group] = []
        try:
            p_inst = self.prefill.choose(rid, key) if self.prefill else None
            if self.prefill:
                chosen.append(self.prefill)
            d_inst = self.answer.choose(rid, key)
            chosen.append(self.answer)
        except NoInstance as e:
            self._finish(rid, chosen)
            self.errors += 1
            return error_response(503, str(e))
        d_body = p_body = body
        if p_inst is not None:
            extra = {"bootstrap_host": p_inst.host, "bootstrap_port": p_inst.bootstrap_port,
                     "bootstrap_room": random.getrandbits(63)}
            d_body = p_body = {**body, **extra}
        legs = Legs()
        p_task = legs.start(p_inst, post_whole(self.client, p_inst, path, p_body, self.args)) if p_inst else None
        if p_task is not None:  # the prefill's load is its prefills in progress: it ends with the prefill's answer
            p_task.add_done_callback(lambda _: self.prefill.finish(rid))
        if body.get("stream") is True:
            return await self._stream(rid, chosen, legs, d_inst, path, d_body)
        try:
            d_task = legs.start(d_inst, post_whole(self.client, d_inst, path, d_body, self.args))
            answer = await legs.until(d_task)
            if p_task is not None and not p_task.done():  # the prefill answers once the decode's ack reaches it:
                await asyncio.wait([p_task], timeout=PREFILL_GRACE_S)  # closing its leg first would abort it there
            return JSONResponse(answer)
        except UpstreamError as e:
            return self._failed(e)
        finally:
            legs.close()
            self._finish(rid, chosen)

    async def _stream(self, rid: str, chosen: list[Group], legs: Legs, d_inst: Instance, path: str,
                      body: dict) -> Response:
        try:
            resp = await legs.until(legs.start(d_inst, open_stream(self.client, d_inst, path, body, self.args),
                                               release=False))
        except BaseException as e:
            opened = legs.tasks[d_inst]
            if opened.done() and not opened.cancelled() and opened.exception() is None:
                await opened.result().aclose()  # the decode's headers came just as the prefill failed
            legs.close()
            self._finish(rid, chosen)
            if isinstance(e, UpstreamError):
                return self._failed(e)
            raise

        async def end() -> None:  # idempotent: the relay's finally and the response's both call it
            legs.close()
            self._finish(rid, chosen)
            await resp.aclose()
        return RelayResponse(self._relay(legs, d_inst, resp, end), end)

    async def _relay(self, legs: Legs, d_inst: Instance, resp: httpx.Response,
                     end: Callable[[], Awaitable[None]]) -> AsyncIterator[bytes]:
        """The decode's events as they come, whole (each ends with a blank line, as the servers write them: an
        upstream killed inside an event leaves no half event before the error); a failure of either side ends
        the stream with an error event."""
        chunks, tail, pending = resp.aiter_raw(), b"", b""
        try:
            while (chunk := await legs.until(next_chunk(chunks, d_inst, self.args))) is not None:
                pending += chunk
                cut = pending.rfind(b"\n\n") + 2
                if cut >= 2:
                    whole, pending = pending[:cut], pending[cut:]
                    tail = (tail + whole)[-len(SSE_DONE):]
                    yield whole
            if pending or tail != SSE_DONE:  # a stream cut short (an upstream speaking HTTP/1.0 just closes)
                raise UpstreamError(d_inst, "ended its stream without data: [DONE]")
        except UpstreamError as e:
            self._count(e)
            yield sse(error_body(e.status, str(e)))
            yield SSE_DONE
        finally:
            await end()

    def _count(self, e: UpstreamError) -> None:
        if e.status >= 500:
            self.errors += 1
            e.instance.errors += 1
            self.health.kick(e.instance)  # its other requests learn within one health check
            logger.warning("request failed: %s", e)

    def _failed(self, e: UpstreamError) -> Response:
        self._count(e)
        if e.body is not None:
            return JSONResponse(e.body, status_code=e.status)
        return error_response(e.status, str(e))

    @staticmethod
    def _finish(rid: str, chosen: list[Group]) -> None:
        for g in chosen:
            g.finish(rid)
