"""A non-streaming request ends with its client: while a handler awaits the whole answer it also awaits the
connection's next ASGI message, which after the body can only be `http.disconnect` (uvicorn sends it the
moment the socket closes), and when the client is gone it cancels the wait. `request.is_disconnected()`
would be the polling form of the same; it cannot see through the app's `http` middleware (Starlette's
BaseHTTPMiddleware answers it from a cancelled scope: always False), the message can.
Cancelling unwinds the request's generators (TokenizerManager._generate's `finally` sends the abort, so
the scheduler frees its KV at its next step), or, in the router, the upstream call (its connection closes,
so the server behind it sees the disconnect and aborts in turn). `ClientGone` then ends the handler (HTTP
499, nginx's "client closed request", which nobody reads). A stream needs none of this: its next write
fails and the same `finally` runs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Optional, TypeVar

from fastapi import Request

logger = logging.getLogger(__name__)
T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection before the answer was ready; the request was aborted."""


async def _disconnect(request: Request) -> bool:
    """True once the client disconnects; False when the connection cannot be watched (then never mind)."""
    try:
        while True:
            if (await request.receive())["type"] == "http.disconnect":
                return True
    except RuntimeError as e:  # an unexpected message: stop watching, the answer still comes
        logger.debug("client watch stopped: %s", e)
        return False


async def unless_client_gone(request: Request, answer: Awaitable[T],
                             on_gone: Optional[Callable[[], None]] = None) -> T:
    """answer's result, or ClientGone (answer cancelled, on_gone called) once the client disconnects."""
    task = asyncio.ensure_future(answer)
    watch = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and not watch.result():
            await task  # not watchable: the answer alone
        if task.done():
            return task.result()
    finally:
        for t in (watch, task):
            if not t.done():
                t.cancel()
        await asyncio.gather(watch, task, return_exceptions=True)
    logger.debug("client disconnected: request cancelled")  # benchmarks/bench_disconnect.py reads the time
    if on_gone is not None:
        on_gone()
    raise ClientGone("the client closed the connection before the answer; the request was aborted")
