"""The HTTP app: routers per protocol, each a module of top-level handlers over services.py: native
(generate_api.py, PROTOCOL.md), control (control_api.py, /metrics), OpenAI (openai_api.py), pooling
(pooling_api.py: embeddings, /encode, rerank, score), dashboard, Anthropic (anthropic_api.py: its error shape by
anthropic_errors.py), /tokenize + /detokenize (tokenize_api.py), llama.cpp's /infill (infill_api.py).

Bodies are parsed by hand, not by pydantic models, so that every malformed request gets the
documented 400 `{"error": {"message": ...}}` naming the problem (FastAPI's default would be a 422
with a different shape). Streaming responses are Server-Sent Events: `data: {json}\\n\\n` per chunk,
then `data: [DONE]\\n\\n`.
"""

from __future__ import annotations

import hmac
import logging
from typing import Callable, Optional

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixlang_runtime.version import __version__
from radixlang_runtime.server.anthropic_api import router as anthropic_router
from radixlang_runtime.server.anthropic_errors import AnthropicErrorShape, x_api_key_ok
from radixlang_runtime.server.client_watch import ClientGone
from radixlang_runtime.server.control_api import metrics_router
from radixlang_runtime.server.control_api import router as control_router
from radixlang_runtime.server.dashboard import router as dashboard_router
from radixlang_runtime.server.generate_api import router as native_router
from radixlang_runtime.server.http_common import (METRICS_ROUTE, OPEN_ROUTES, BodyTooLarge, ServerState,
                                                  chat_template_text, error_response)
from radixlang_runtime.server.infill_api import router as infill_router
from radixlang_runtime.server.lora_api import router as lora_router
from radixlang_runtime.server.lifecycle import RequestUnavailable, ShuttingDown
from radixlang_runtime.server.openai_records import ModelNotFound
from radixlang_runtime.server.openai_api import router as openai_router
from radixlang_runtime.server.responses_api import router as responses_router
from radixlang_runtime.server.tokenize_api import router as tokenize_router
from radixlang_runtime.server.pooling_api import router as pooling_router
from radixlang_runtime.server.tokenizer_manager import RuntimeUnavailable
from radixlang_runtime.server.weights_api import router as weights_router

logger = logging.getLogger(__name__)


def create_app(state: ServerState, lifespan: Optional[Callable] = None) -> FastAPI:
    """The app: the routers per protocol (native, control, OpenAI, dashboard; /metrics with
    --enable-metrics), the API key middleware, the error shapes, IntakeGuard outermost."""
    app = FastAPI(title="radixlang", version=__version__, lifespan=lifespan)
    app.state.server = state  # what every handler reads (generate_api.server_state)
    if state.flag_template is None:
        state.flag_template = chat_template_text(state.args.chat_template)  # --chat-template's text, read once
    app.middleware("http")(auth_and_log)
    for kind, handler in _ERROR_HANDLERS:
        app.add_exception_handler(kind, handler)
    for router in (native_router, control_router, openai_router, responses_router, pooling_router, dashboard_router,
                   anthropic_router, tokenize_router, infill_router, lora_router, weights_router):
        app.include_router(router)
    if state.args.enable_metrics and state.tm.metrics is not None:
        app.include_router(metrics_router)
    app.add_middleware(IntakeGuard, max_body_bytes=state.args.max_request_body_bytes)
    app.add_middleware(AnthropicErrorShape)  # added last: outermost (its paths' errors in Anthropic's shape)
    return app


async def auth_and_log(request: Request, call_next: Callable) -> Response:
    args = request.app.state.server.args
    path = request.url.path
    open_route = path.startswith(OPEN_ROUTES) or (args.metrics_no_auth and path == METRICS_ROUTE)
    if args.api_key and not open_route:
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, f"Bearer {args.api_key}".encode()) and \
                not x_api_key_ok(path, request.headers, args.api_key):
            return error_response(401, "invalid or missing API key (Authorization: Bearer ...)")
    response = await call_next(request)
    if args.log_requests:
        logger.info("%s %s -> %d", request.method, request.url.path, response.status_code)
    return response


async def _bad_request(request: Request, e: ValueError) -> Response:  # BadRequest, SamplingParams / limits checks
    return error_response(400, str(e), getattr(e, "param", None))


async def _shutting_down(request: Request, e: ShuttingDown) -> Response:  # draining (SIGTERM)
    return error_response(503, str(e))


async def _request_unavailable(request: Request, e: RequestUnavailable) -> Response:  # a PD transfer failed
    return error_response(503, str(e))


async def _unavailable(request: Request, e: RuntimeUnavailable) -> Response:
    return error_response(503, f"the runtime is unavailable: {e}")


async def _request_failed(request: Request, e: RuntimeError) -> Response:  # an internal fault: 500, connection kept
    return error_response(500, str(e))


async def _http_error(request: Request, e: StarletteHTTPException) -> Response:  # 404 / 405 from routing
    return error_response(e.status_code, str(e.detail), headers=getattr(e, "headers", None))


async def _client_gone(request: Request, e: ClientGone) -> Response:  # nobody reads it: nginx's 499
    return error_response(499, str(e))


async def _model_not_found(request: Request, e: ModelNotFound) -> Response:
    return error_response(404, str(e), "model", "model_not_found")


_ERROR_HANDLERS = ((ValueError, _bad_request), (ShuttingDown, _shutting_down),
                   (RequestUnavailable, _request_unavailable), (RuntimeUnavailable, _unavailable),
                   (RuntimeError, _request_failed), (StarletteHTTPException, _http_error),
                   (ModelNotFound, _model_not_found), (ClientGone, _client_gone))


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
