"""The HTTP app: SGLang's native routes (PROTOCOL.md), the OpenAI routes (openai_api.py), /metrics.

Bodies are parsed by hand, not by pydantic models, so that every malformed request gets the
documented 400 `{"error": {"message": ...}}` naming the problem (FastAPI's default would be a 422
with a different shape). Streaming responses are Server-Sent Events: `data: {json}\\n\\n` per chunk,
then `data: [DONE]\\n\\n`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Callable, Optional

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixlang_runtime import __version__
from radixlang_runtime.limits import MAX_RID_LEN, need_str
from radixlang_runtime.mem.hicache import check_flush_tiers
from radixlang_runtime.server.dashboard import add_dashboard_routes
from radixlang_runtime.server.generate_api import generate_route, input_size
from radixlang_runtime.server.http_common import (HTTP_PIN_TTL_S, OPEN_ROUTES, BadRequest, BodyTooLarge, ServerState,
                                                  chat_template_text, error_response, final_result, parse_pin_body,
                                                  read_json)
from radixlang_runtime.server.lifecycle import ShuttingDown
from radixlang_runtime.server.openai_api import add_openai_routes
from radixlang_runtime.server.tokenizer_manager import RuntimeUnavailable

logger = logging.getLogger(__name__)


def create_app(state: ServerState, lifespan: Optional[Callable] = None) -> FastAPI:
    app = FastAPI(title="radixlang", version=__version__, lifespan=lifespan)
    tm, args = state.tm, state.args

    @app.middleware("http")
    async def auth_and_log(request: Request, call_next):
        if args.api_key and not request.url.path.startswith(OPEN_ROUTES):
            if request.headers.get("authorization") != f"Bearer {args.api_key}":
                return error_response(401, "invalid or missing API key (Authorization: Bearer ...)")
        response = await call_next(request)
        if args.log_requests:
            logger.info("%s %s -> %d", request.method, request.url.path, response.status_code)
        return response

    @app.exception_handler(ValueError)  # BadRequest, and SamplingParams / limits validation
    async def bad_request(request: Request, e: ValueError):
        return error_response(400, str(e), getattr(e, "param", None))

    @app.exception_handler(ShuttingDown)  # draining (SIGTERM): "server is shutting down..."
    async def shutting_down(request: Request, e: ShuttingDown):
        return error_response(503, str(e))

    @app.exception_handler(RuntimeUnavailable)
    async def unavailable(request: Request, e: RuntimeUnavailable):
        return error_response(503, f"the runtime is unavailable: {e}")

    @app.exception_handler(RuntimeError)  # a request ended by an internal fault: 500, connection kept
    async def request_failed(request: Request, e: RuntimeError):
        return error_response(500, str(e))

    @app.exception_handler(StarletteHTTPException)  # 404 / 405 from routing, in the one error shape
    async def http_error(request: Request, e: StarletteHTTPException):
        return error_response(e.status_code, str(e.detail), headers=getattr(e, "headers", None))

    @app.post("/generate")
    async def generate(request: Request):
        return await generate_route(state, request)

    @app.get("/health")
    async def health():
        if (why := await tm.health()) is not None:  # dead, draining, or a scheduler stuck with work waiting
            return error_response(503, why)
        if state.frontend is not None and (why := state.frontend.problem()) is not None:  # frontend_zmq.py
            return error_response(503, why)
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate():
        try:
            sp = tm.prepare([1], {"max_new_tokens": 1, "temperature": 0})
            await asyncio.wait_for(final_result(tm.generate([1], sp)), timeout=30)
        except Exception as e:
            return error_response(503, f"generation failed: {e}")
        return Response(status_code=200)

    flag_template = chat_template_text(args.chat_template)  # --chat-template's text (read once), else None

    def frontend_port() -> Optional[int]:
        """The DSL's ZeroMQ link's port while it serves (RuntimeEndpoint(http URL) connects to it), else None."""
        fe = state.frontend
        return fe.port if fe is not None and fe.problem() is None else None

    def model_info():
        return {"model_path": args.model_path or state.model_dir, "served_model_name": state.served_model_name,
                "tokenizer_path": args.tokenizer_path or state.model_dir, "is_generation": True,
                "max_context_length": tm.limits.context_len,
                # --chat-template, else the model's own: the DSL renders roles with it
                "chat_template": flag_template or getattr(tm.tokenizer, "chat_template", None),
                "frontend_port": frontend_port()}

    app.get("/model_info")(model_info)
    app.get("/get_model_info")(model_info)

    async def server_info():
        stats = await tm.get_stats()
        return {**args.to_public_dict(), **state.info, "version": __version__, "stats": stats,
                "pids": {"server": os.getpid(), **state.child_pids},
                "frontend_port": frontend_port(),  # the bound port (the flag's 0 picks one), None: no link
                "frontend": state.frontend.stats() if state.frontend else None}

    app.get("/server_info")(server_info)
    app.get("/get_server_info")(server_info)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request):
        """?tiers=l1,l2,l3 (any of them; default all): the hierarchical cache's tiers to clear too."""
        try:
            raw = request.query_params.get("tiers")
            tiers = check_flush_tiers(raw.split(",") if raw is not None else None)
        except ValueError as e:
            return error_response(400, str(e), param="tiers")
        if await tm.flush_cache(tiers):
            return PlainTextResponse("Cache flushed.\n")
        return error_response(400, "Cache not flushed: requests are queued or running, or a prefix is pinned.")

    @app.post("/pin_prefix")
    async def pin_prefix(request: Request):
        """{"text" | "input_ids", "ttl_s"?} -> {"pin_id", "pinned_len", "input_len"}: locks what is cached."""
        body = await read_json(request)
        ids, ttl_s = await tm.run_intake(parse_pin_body, tm, body, HTTP_PIN_TTL_S, size=input_size(body))
        return await tm.pin_prefix(ids, ttl_s)

    @app.post("/unpin_prefix")
    async def unpin_prefix(request: Request):
        body = await read_json(request)
        if not isinstance(body, dict) or "pin_id" not in body:
            raise BadRequest("unpin_prefix needs {\"pin_id\": \"...\"}")
        pin_id = need_str(body["pin_id"], "pin_id", MAX_RID_LEN)
        return {"pin_id": pin_id, "success": await tm.unpin_prefix(pin_id)}

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await read_json(request)
        if not isinstance(body, dict) or "rid" not in body:
            raise BadRequest("abort_request needs {\"rid\": \"...\"}")
        tm.abort(need_str(body["rid"], "rid", MAX_RID_LEN))
        return Response(status_code=200)

    @app.post("/concate_and_append_request")
    async def concate_and_append(request: Request):
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("src_rids"), list):
            raise BadRequest("concate_and_append_request needs {\"src_rids\": [...], \"dst_rid\": ...}")
        return {}  # the frontend already joined the texts; the radix cache shares the KV by itself

    if args.enable_metrics and tm.metrics is not None:
        @app.get("/metrics")
        async def metrics():
            data = tm.metrics.render(await tm.get_stats())
            return Response(data, media_type="text/plain; version=0.0.4; charset=utf-8")

    add_openai_routes(app, state)
    add_dashboard_routes(app, state)
    app.add_middleware(IntakeGuard, max_body_bytes=args.max_request_body_bytes)  # added last: outermost
    return app


class IntakeGuard:
    """The outermost layer of the app (plain ASGI).
    - Body cap: a Content-Length above max_body_bytes answers 413 before a byte of the body is read; a
      body that grows past it while it is read (chunked) ends the read with 413. Both close the
      connection (the client is still sending what we will not read).
    - An exception no handler took (a bug) answers the JSON 500 here. Starlette's ServerErrorMiddleware
      would answer too, but then re-raise, and uvicorn closes the keep-alive connection after such an
      exception: the client's next request on that connection failed. Here the connection stays usable.
    Once a response has started nothing more can be sent: the exception is logged and uvicorn ends it."""

    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._too_large(int(declared), scope, receive, send)
            return
        started = False
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise BodyTooLarge(seen)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except Exception as e:
            if _only(e, BodyTooLarge):
                if not started:
                    await self._too_large(seen, scope, receive, send)
                return
            logger.exception("request failed: %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await error_response(500, f"internal error: {e!r}")(scope, receive, send)

    async def _too_large(self, size: int, scope: Scope, receive: Receive, send: Send) -> None:
        message = (f"the request body (at least {size} bytes) is larger than the limit of {self.max_body_bytes} "
                   "bytes (--max-request-body-bytes)")
        await error_response(413, message, "max_request_body_bytes",
                             headers={"connection": "close"})(scope, receive, send)


def _only(e: BaseException, kind: type) -> bool:
    """e is a `kind`, or a group of nothing else (BaseHTTPMiddleware's task group wraps what the body read raises)."""
    subs = getattr(e, "exceptions", None)  # an exception group (no builtin on Python 3.10)
    if isinstance(subs, tuple) and subs:
        return all(_only(x, kind) for x in subs)
    return isinstance(e, kind)
