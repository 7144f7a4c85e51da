"""The router's HTTP app: RouterState (what the routes share, built in the app's lifespan), the error shape
(server/http_common.py's), the routes of routes.py, and the Prometheus text of /metrics (requests routed and
errors per instance, health, in-flight, clients that left before a whole answer)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, AsyncIterator

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixlang_runtime.router import routes as router_routes
from radixlang_runtime.router.config import RouterArgs
from radixlang_runtime.router.health import HealthMonitor
from radixlang_runtime.router.instances import Group
from radixlang_runtime.router.pd_proxy import Dispatcher
from radixlang_runtime.router.upstream import timeouts
from radixlang_runtime.server.client_watch import ClientGone
from radixlang_runtime.server.http_common import error_response

logger = logging.getLogger(__name__)


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
                "groups": {g.role: {"policy": g.placement.config.policy, "instances": g.view(),
                                    "placement": g.placement.stats()} for g in self.groups},
                "requests": self.dispatcher.requests, "errors": self.dispatcher.errors}


async def _bad_request(request: Request, e: ValueError) -> Response:  # BadRequest, FieldError (with param)
    return error_response(400, str(e), getattr(e, "param", None))


async def _http_error(request: Request, e: StarletteHTTPException) -> Response:
    return error_response(e.status_code, str(e.detail))


async def _client_gone(request: Request, e: ClientGone) -> Response:  # nobody reads it: nginx's 499
    return error_response(499, str(e))


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
    app.add_exception_handler(ValueError, _bad_request)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientGone, _client_gone)
    app.include_router(router_routes.router)
    return app
