"""The control router: /health (+ /ping), /health_generate, /version, /server_info (+ /get_server_info), /flush_cache,
/pin_prefix, /unpin_prefix, /abort_request, and /metrics (its own router: mounted with --enable-metrics).
Top-level handlers over the service layer (services.py), as the DSL's ZeroMQ frontend calls it too.
"""

from __future__ import annotations

import asyncio
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from radixlang_runtime.protocol.generate_input import fan_out
from radixlang_runtime.protocol.limits import MAX_RID_LEN, need_str
from radixlang_runtime.mem.hicache import check_flush_tiers
from radixlang_runtime.pooling import PoolSpec
from radixlang_runtime.protocol.pooling_fields import PoolingOptions
from radixlang_runtime.protocol.pooling_input import pooling_requests
from radixlang_runtime.server import services
from radixlang_runtime.server.generate_api import server_state
from radixlang_runtime.server.http_common import HTTP_PIN_TTL_S, BadRequest, error_response, final_result, read_json
from radixlang_runtime.version import __version__

router = APIRouter()
metrics_router = APIRouter()


@router.get("/health")
@router.api_route("/ping", methods=["GET", "POST"])  # vLLM's (SageMaker's) name for the same check
async def health(request: Request) -> Response:
    state = server_state(request)
    if (why := await state.tm.health()) is not None:  # dead, draining, or a scheduler stuck with work waiting
        return error_response(503, why)
    if state.frontend is not None and (why := state.frontend.problem()) is not None:  # frontend_zmq.py
        return error_response(503, why)
    return Response(status_code=200)


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    tm = server_state(request).tm
    try:
        if tm.limits.is_embedding:  # a pooling model runs one prefill-only request instead
            req = pooling_requests([[1]], PoolSpec("last"), tm.encode_text, tm.limits, "input_ids",
                                   PoolingOptions(uuid.uuid4().hex))[0]
        else:
            req = fan_out([[1]], [{"max_new_tokens": 1, "temperature": 0}], [None], lambda i, ids: None, tm.limits)[0]
        await asyncio.wait_for(final_result(tm.generate(req)), timeout=30)
    except Exception as e:
        return error_response(503, f"generation failed: {e}")
    return Response(status_code=200)


@router.get("/version")
async def version() -> dict:
    """vLLM's /version: the server's version."""
    return {"version": __version__}


@router.get("/server_info")
@router.get("/get_server_info")
async def server_info(request: Request):
    return await services.server_info(server_state(request))


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> Response:
    """?tiers=l1,l2,l3 (any of them; default all): the hierarchical cache's tiers to clear too."""
    try:
        raw = request.query_params.get("tiers")
        tiers = check_flush_tiers(raw.split(",") if raw is not None else None)
    except ValueError as e:
        return error_response(400, str(e), param="tiers")
    if await services.flush_cache(server_state(request), tiers):
        return PlainTextResponse(services.FLUSHED)
    return error_response(400, services.NOT_FLUSHED)


def _pin_owner(request: Request) -> str:
    """The caller's API key (checked by the auth middleware) as a pin owner; "" when the server has none."""
    if not server_state(request).args.api_key:
        return ""
    return services.pin_owner(request.headers.get("authorization", "").removeprefix("Bearer "))


@router.post("/pin_prefix")
async def pin_prefix(request: Request):
    """{"text" | "input_ids", "ttl_s"?} -> {"pin_id", "pinned_len", "input_len"}: locks what is cached."""
    return await services.pin_prefix(server_state(request).tm, await read_json(request), HTTP_PIN_TTL_S,
                                     _pin_owner(request))


@router.post("/unpin_prefix")
async def unpin_prefix(request: Request) -> Response:
    """{"pin_id"} -> {"pin_id", "success": true}; 404 when there is no such pin of this caller's key."""
    pin_id = services.pin_id_of(await read_json(request))
    out = await services.unpin_prefix(server_state(request).tm, pin_id, _pin_owner(request))
    if not out["success"]:
        return error_response(404, f"no pin {pin_id!r} (unknown, unpinned, expired, or made with another key)",
                              "pin_id")
    return JSONResponse(out)


@router.post("/abort_request")
async def abort_request(request: Request) -> Response:
    body = await read_json(request)
    if not isinstance(body, dict) or "rid" not in body:
        raise BadRequest("abort_request needs {\"rid\": \"...\"}")
    server_state(request).tm.abort(need_str(body["rid"], "rid", MAX_RID_LEN))
    return Response(status_code=200)


@metrics_router.get("/metrics")
async def metrics(request: Request) -> Response:
    tm = server_state(request).tm
    data = tm.metrics.render(await tm.get_stats())
    return Response(data, media_type="text/plain; version=0.0.4; charset=utf-8")
