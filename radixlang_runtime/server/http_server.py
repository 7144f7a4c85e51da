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

from radixlang_runtime import __version__
from radixlang_runtime.server.dashboard import add_dashboard_routes
from radixlang_runtime.server.generate_api import generate_route
from radixlang_runtime.server.http_common import (HTTP_PIN_TTL_S, OPEN_ROUTES, BadRequest, ServerState, error_response,
                                                  final_result, parse_pin_body, read_json)
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
        return error_response(400, str(e))

    @app.exception_handler(ShuttingDown)  # draining (SIGTERM): "server is shutting down..."
    async def shutting_down(request: Request, e: ShuttingDown):
        return error_response(503, str(e))

    @app.exception_handler(RuntimeUnavailable)
    async def unavailable(request: Request, e: RuntimeUnavailable):
        return error_response(503, f"the runtime is unavailable: {e}")

    @app.exception_handler(RuntimeError)  # a request ended by an internal fault: 500, connection kept
    async def request_failed(request: Request, e: RuntimeError):
        return error_response(500, str(e))

    @app.exception_handler(Exception)
    async def internal(request: Request, e: Exception):  # never a hang or a bare traceback
        logger.exception("request failed")
        return error_response(500, f"internal error: {e!r}")

    @app.post("/generate")
    async def generate(request: Request):
        return await generate_route(state, request)

    @app.get("/health")
    async def health():
        if (why := await tm.health()) is not None:  # dead, draining, or a scheduler stuck with work waiting
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

    def model_info():
        return {"model_path": args.model_path or state.model_dir, "served_model_name": state.served_model_name,
                "tokenizer_path": args.tokenizer_path or state.model_dir, "is_generation": True,
                "max_context_length": tm.limits.context_len,
                "chat_template": getattr(tm.tokenizer, "chat_template", None)}  # the DSL renders roles with it

    app.get("/model_info")(model_info)
    app.get("/get_model_info")(model_info)

    async def server_info():
        stats = await tm.get_stats()
        return {**args.to_dict(), **state.info, "version": __version__, "stats": stats,
                "pids": {"server": os.getpid(), **state.child_pids}}

    app.get("/server_info")(server_info)
    app.get("/get_server_info")(server_info)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        if await tm.flush_cache():
            return PlainTextResponse("Cache flushed.\n")
        return error_response(400, "Cache not flushed: requests are queued or running, or a prefix is pinned.")

    @app.post("/pin_prefix")
    async def pin_prefix(request: Request):
        """{"text" | "input_ids", "ttl_s"?} -> {"pin_id", "pinned_len", "input_len"}: locks what is cached."""
        ids, ttl_s = parse_pin_body(tm, await read_json(request), HTTP_PIN_TTL_S)
        return await tm.pin_prefix(ids, ttl_s)

    @app.post("/unpin_prefix")
    async def unpin_prefix(request: Request):
        body = await read_json(request)
        pin_id = body.get("pin_id") if isinstance(body, dict) else None
        if not isinstance(pin_id, str):
            raise BadRequest("unpin_prefix needs {\"pin_id\": \"...\"}")
        return {"pin_id": pin_id, "success": await tm.unpin_prefix(pin_id)}

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await read_json(request)
        rid = body.get("rid") if isinstance(body, dict) else None
        if not isinstance(rid, str):
            raise BadRequest("abort_request needs {\"rid\": \"...\"}")
        tm.abort(rid)
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
    return app
