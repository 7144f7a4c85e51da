"""The router's routes, top-level handlers on one APIRouter (as server/'s are): the routed generate routes
(/generate, /v1/completions, /v1/chat/completions: a client that disconnects before a whole answer cancels
the upstream leg, server/client_watch.py), /v1/models (from an eligible decode / worker), /flush_cache (every
instance, and the approximate trees), /health (200 while each role has an eligible instance), /server_info
(instances, health, loads) and /metrics. The state is the app's (`request.app.state.router`, app.py)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from radixlang_runtime.server.client_watch import unless_client_gone
from radixlang_runtime.server.http_common import error_response, read_json

if TYPE_CHECKING:
    from radixlang_runtime.router.app import RouterState

router = APIRouter()
GENERATE_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")


async def routed(request: Request) -> Response:
    """One generate route: raced against the client's disconnect (the upstream connection closes with it, so
    the server behind aborts the request); a relayed stream ends with its client by itself."""
    dispatcher = request.app.state.router.dispatcher
    return await unless_client_gone(request, dispatcher.handle(request.url.path, await read_json(request)),
                                    dispatcher.on_client_gone)


for _path in GENERATE_ROUTES:
    router.add_api_route(_path, routed, methods=["POST"])


@router.get("/v1/models")
async def models(request: Request) -> Response:
    state: RouterState = request.app.state.router
    group = state.groups[-1]
    for inst in (i for i in group.instances if i.eligible):
        try:
            r = await state.client.get(inst.url + "/v1/models", timeout=state.args.health_check_timeout_secs)
            if r.status_code == 200:
                return JSONResponse(r.json())
        except (httpx.HTTPError, ValueError):
            continue
    return error_response(503, f"no {group.role} instance answered /v1/models")


async def _flush_one(state: RouterState, url: str) -> str:
    """'' when the instance flushed, else what went wrong."""
    try:
        r = await state.client.post(url + "/flush_cache", timeout=state.args.request_timeout_secs)
        return "" if r.status_code == 200 else f"{url}: {r.status_code} {r.text[:200]}"
    except httpx.HTTPError as e:
        return f"{url}: {type(e).__name__}: {e}"


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> Response:
    state: RouterState = request.app.state.router
    insts = [i for g in state.groups for i in g.instances if i.eligible]
    failed = [f for f in await asyncio.gather(*(_flush_one(state, i.url) for i in insts)) if f]
    for g in state.groups:
        g.placement.reset_trees()
    if failed:
        return error_response(502, "flush_cache failed on " + "; ".join(failed))
    return JSONResponse({"flushed": [i.url for i in insts]})


@router.get("/health")
async def health(request: Request) -> Response:
    state: RouterState = request.app.state.router
    missing = [g.role for g in state.groups if not any(i.eligible for i in g.instances)]
    if missing:
        return error_response(503, f"no healthy {' / '.join(missing)} instance")
    return JSONResponse({"status": "ok"})


@router.get("/server_info")
async def server_info(request: Request) -> Response:
    return JSONResponse(request.app.state.router.view())


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return PlainTextResponse(prometheus_text(request.app.state.router))


def prometheus_text(state: RouterState) -> str:
    lines = ["# TYPE radixlang_router_requests_total counter",
             f"radixlang_router_requests_total {state.dispatcher.requests}",
             "# TYPE radixlang_router_errors_total counter",
             f"radixlang_router_errors_total {state.dispatcher.errors}",
             "# TYPE radixlang_router_client_disconnects_total counter",
             f"radixlang_router_client_disconnects_total {state.dispatcher.client_disconnects}"]
    series = {"routed": ("counter", "radixlang_router_instance_requests_total"),
              "errors": ("counter", "radixlang_router_instance_errors_total"),
              "in_flight": ("gauge", "radixlang_router_instance_in_flight"),
              "eligible": ("gauge", "radixlang_router_instance_healthy")}
    for key, (kind, name) in series.items():
        lines.append(f"# TYPE {name} {kind}")
        for g in state.groups:
            for v in g.view():
                lines.append(f'{name}{{role="{g.role}",instance="{v["url"]}"}} {int(v[key])}')
    return "\n".join(lines) + "\n"
