"""The router's HTTP app: the routed generate routes (/generate, /v1/completions, /v1/chat/completions),
/v1/models (from an eligible decode / worker), /flush_cache (every instance, and the approximate trees),
/health (200 while each role has an eligible instance), /server_info (instances, health, loads) and
/metrics (Prometheus text: requests routed and errors per instance, health, in-flight, clients that left
before a whole answer: their upstream call is cancelled, server/client_watch.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, AsyncIterator

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixlang_runtime.router.config import RouterArgs
from radixlang_runtime.router.health import HealthMonitor
from radixlang_runtime.router.instances import Group
from radixlang_runtime.router.pd_proxy import Dispatcher
from radixlang_runtime.router.upstream import timeouts
from radixlang_runtime.server.client_watch import ClientGone, unless_client_gone
from radixlang_runtime.server.http_common import error_response, read_json

logger = logging.getLogger(__name__)
GENERATE_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")


class RouterState:
    """Everything the routes share; built inside the app's event loop (lifespan)."""

    def __init__(self, args: RouterArgs):
        self.args = args
        if args.pd_disaggregation:
            self.groups = [Group("prefill", args.prefill, args), Group("decode", args.decode, args)]
        else:
            self.groups = [Group("worker", args.worker_urls, args)]
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        self.client = httpx.AsyncClient(limits=limits, timeout=timeouts(args))
        self.health = HealthMonitor(self.groups, self.client, args)
        prefill = self.groups[0] if args.pd_disaggregation else None
        self.dispatcher = Dispatcher(args, self.client, self.health, prefill, self.groups[-1])

    def view(self) -> dict[str, Any]:
        return {"mode": "pd" if self.args.pd_disaggregation else "workers",
                "groups": {g.role: {"policy": g.router.config.policy, "instances": g.view(),
                                    "router": g.router.stats()} for g in self.groups},
                "requests": self.dispatcher.requests, "errors": self.dispatcher.errors}


def create_app(args: RouterArgs) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = app.state.router = RouterState(args)
        monitor = asyncio.create_task(state.health.run())
        try:
            yield
        finally:
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)
            await state.client.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.exception_handler(ValueError)
    async def _bad_request(request: Request, e: ValueError) -> Response:  # BadRequest, FieldError (with param)
        return error_response(400, str(e), getattr(e, "param", None))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> Response:
        return error_response(e.status_code, str(e.detail))

    @app.exception_handler(ClientGone)
    async def _client_gone(request: Request, e: ClientGone) -> Response:  # nobody reads it: nginx's 499
        return error_response(499, str(e))

    def routed(path: str) -> None:
        async def handler(request: Request) -> Response:
            # a client that disconnects before a whole answer cancels the upstream leg (its connection closes:
            # the server behind it aborts the request); a relayed stream ends with its client by itself
            dispatcher = request.app.state.router.dispatcher
            return await unless_client_gone(request, dispatcher.handle(path, await read_json(request)),
                                            dispatcher.on_client_gone)
        app.add_api_route(path, handler, methods=["POST"])

    for path in GENERATE_ROUTES:
        routed(path)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        state: RouterState = request.app.state.router
        group = state.groups[-1]
        for inst in (i for i in group.instances if i.eligible):
            try:
                r = await state.client.get(inst.url + "/v1/models", timeout=args.health_check_timeout_secs)
                if r.status_code == 200:
                    return JSONResponse(r.json())
            except (httpx.HTTPError, ValueError):
                continue
        return error_response(503, f"no {group.role} instance answered /v1/models")

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request) -> Response:
        state: RouterState = request.app.state.router
        insts = [i for g in state.groups for i in g.instances if i.eligible]

        async def one(url: str) -> str:
            try:
                r = await state.client.post(url + "/flush_cache", timeout=args.request_timeout_secs)
                return "" if r.status_code == 200 else f"{url}: {r.status_code} {r.text[:200]}"
            except httpx.HTTPError as e:
                return f"{url}: {type(e).__name__}: {e}"

        failed = [f for f in await asyncio.gather(*(one(i.url) for i in insts)) if f]
        for g in state.groups:
            g.router.reset_trees()
        if failed:
            return error_response(502, "flush_cache failed on " + "; ".join(failed))
        return JSONResponse({"flushed": [i.url for i in insts]})

    @app.get("/health")
    async def health(request: Request) -> Response:
        state: RouterState = request.app.state.router
        missing = [g.role for g in state.groups if not any(i.eligible for i in g.instances)]
        if missing:
            return error_response(503, f"no healthy {' / '.join(missing)} instance")
        return JSONResponse({"status": "ok"})

    @app.get("/server_info")
    async def server_info(request: Request) -> Response:
        return JSONResponse(request.app.state.router.view())

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        return PlainTextResponse(prometheus_text(request.app.state.router))

    return app


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
