"""The live view: GET /dashboard (one static page: plain JS + SVG, no external assets) and
GET /dashboard/state (JSON, polled by the page at 2 Hz).

- The state comes from the scheduler's stats message (detail="dashboard", scheduler/dashboard_state.py)
  plus the HTTP process's recent history (live_series.py). Answers are shared for STATE_TTL_S, so any
  number of open pages costs the scheduler at most 1 / STATE_TTL_S stats requests a second.
- With --api-key: the key in the Authorization header, the `radixlang_api_key` cookie (set by the
  page's login form) or `?key=`; without it /dashboard serves the login form and /dashboard/state 401.
- Prompt text never leaves the server unless --dashboard-show-text: nodes carry sizes, locks and ages;
  with the flag, each shown node also carries `text`, its first tokens decoded.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from typing import Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse

from radixlang_runtime.server.http_common import ServerState, error_response

STATE_TTL_S = 0.25
COOKIE = "radixlang_api_key"
_STATIC = os.path.join(os.path.dirname(__file__), "static")


def _page(name: str) -> str:
    with open(os.path.join(_STATIC, name), encoding="utf-8") as f:
        return f.read()


def authorized(request: Request, api_key: Optional[str]) -> bool:
    if not api_key:
        return True
    given = (request.headers.get("authorization", "").removeprefix("Bearer ")
             or request.cookies.get(COOKIE) or request.query_params.get("key") or "")
    return hmac.compare_digest(given.encode(), api_key.encode())


class DashboardFeed:
    """One shared state answer per STATE_TTL_S (concurrent pollers await the same scheduler call)."""

    def __init__(self, state: ServerState):
        self.state = state
        self._cached: Optional[dict[str, Any]] = None
        self._at = 0.0
        self._lock = asyncio.Lock()

    async def get(self) -> dict[str, Any]:
        async with self._lock:
            if self._cached is None or time.monotonic() - self._at >= STATE_TTL_S:
                self._cached = await self._build()
                self._at = time.monotonic()
            return self._cached

    async def _build(self) -> dict[str, Any]:
        tm, args = self.state.tm, self.state.args
        stats = await tm.get_dashboard_stats(with_ids=args.dashboard_show_text)
        dash = stats.pop("dashboard")
        tm.live.sample(dash)
        tree = dash.get("tree")
        if tree is not None and args.dashboard_show_text:
            for n in tree["nodes"]:
                ids = n.pop("head_ids", None)
                if ids:
                    n["text"] = tm.tokenizer.decode(ids)
        hits, computed = dash["prefill_tokens_cached"], dash["prefill_tokens_computed"]
        return {"model": self.state.served_model_name, "show_text": args.dashboard_show_text,
                "queues": dash["queues"], "kv": dash["kv"], "tree": tree, "tiers": dash.get("tiers"),
                "spec": dash.get("spec"),
                "cache_hit_rate": hits / max(1, hits + computed), "series": tm.live.snapshot(),
                "cpu": stats.get("cpu"), "replica": 0, "num_replicas": len(tm.to_replicas)}


router = APIRouter()


def _feed(request: Request) -> DashboardFeed:
    """The app's one feed (shared answers for every open page), made at its first use."""
    feed = getattr(request.app.state, "dashboard_feed", None)
    if feed is None:
        feed = request.app.state.dashboard_feed = DashboardFeed(request.app.state.server)
    return feed


@router.get("/dashboard")
async def dashboard(request: Request) -> HTMLResponse:
    key = request.app.state.server.args.api_key
    return HTMLResponse(_page("dashboard.html" if authorized(request, key) else "dashboard_login.html"))


@router.get("/dashboard/state")
async def dashboard_state(request: Request) -> Any:
    if not authorized(request, request.app.state.server.args.api_key):
        return error_response(401, "invalid or missing API key (log in at /dashboard)")
    return JSONResponse(await _feed(request).get(), headers={"Cache-Control": "no-store"})
