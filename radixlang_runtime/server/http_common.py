"""Shared pieces of the HTTP routes (native, OpenAI) and the DSL's ZeroMQ frontend: the server state,
error shapes, JSON bodies, Server-Sent Events, and the fan-in of several requests' snapshots.

Error shape everywhere: `{"error": {"message", "type", "param", "code"}}`. A stream that fails after
its headers went out sends `data: {"error": ...}` then `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from radixlang_runtime.server.tokenizer_manager import TokenizerManager
from radixlang_runtime.server_args import ServerArgs

OPEN_ROUTES = ("/health", "/health_generate", "/metrics", "/dashboard")  # no key here (/dashboard checks its own)


class BadRequest(ValueError):
    pass


@dataclass
class ServerState:
    args: ServerArgs  # resolved by the scheduler for its device
    tm: TokenizerManager
    model_dir: str
    served_model_name: str
    info: dict[str, Any]  # what the scheduler reported when it became ready
    child_pids: dict[str, int] = field(default_factory=dict)
    frontend: Any = None  # the DSL's ZeroMQ link (frontend_zmq.FrontendServer) while it serves, else None


def error_response(status: int, message: str, param: Optional[str] = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status)


async def read_json(request: Request) -> Any:
    body = await request.body()
    if not body:
        return {}
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"the body is not valid JSON: {e}") from None


HTTP_PIN_TTL_S = 600.0  # an HTTP client is not watched: its pin expires after this unless it says otherwise


def parse_pin_body(tm: TokenizerManager, body: Any,
                   default_ttl_s: Optional[float]) -> tuple[list[int], Optional[float]]:
    """A /pin_prefix body: {"text": str} or {"input_ids": [int, ...]}, optional "ttl_s" (seconds > 0).
    Returns (input_ids, ttl_s); raises BadRequest naming the field."""
    if not isinstance(body, dict) or ("text" in body) == ("input_ids" in body):
        raise BadRequest("pin_prefix needs {\"text\": \"...\"} or {\"input_ids\": [...]} (one of them)")
    if "text" in body:
        if not isinstance(body["text"], str):
            raise BadRequest("text must be a string")
        ids = tm.encode_text(body["text"])
    else:
        ids = body["input_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise BadRequest("input_ids must be a list of token ids")
    ttl = body.get("ttl_s", default_ttl_s)
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl < math.inf):
        raise BadRequest(f"ttl_s must be a positive, finite number of seconds, got {ttl!r}")
    return ids, ttl


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def text_delta(text: str, sent: int) -> tuple[str, int]:
    """The part of a cumulative text not sent yet, and the new sent length. A final text may be shorter
    (a stop string trimmed after it streamed): nothing more is sent then."""
    return text[sent:], max(sent, len(text))


def stream_response(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def guard_stream(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """After the headers went out an error can only travel as an event: send it, then [DONE]."""
    try:
        async for chunk in events:
            yield chunk
    except (ValueError, RuntimeError) as e:
        yield sse({"error": {"message": str(e)}})
        yield SSE_DONE


async def final_result(gen: AsyncIterator[dict]) -> dict:
    last = None
    async for out in gen:
        last = out
    return last


async def merged(gens: list[AsyncIterator[dict]]) -> AsyncIterator[tuple[int, dict]]:
    """Interleave several requests' snapshots as they come: yields (index, snapshot). An error in one
    is raised here; leaving early (client gone, error) closes every generator, aborting its request."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, gen: AsyncIterator[dict]) -> None:
        try:
            async for out in gen:
                await queue.put((i, out))
        except Exception as e:  # surfaced to the consumer below
            await queue.put((i, e))
        await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    try:
        remaining = len(tasks)
        while remaining:
            i, out = await queue.get()
            if out is None:
                remaining -= 1
            elif isinstance(out, Exception):
                raise out
            else:
                yield i, out
    finally:
        for t in tasks:
            t.cancel()
        for g in gens:
            await g.aclose()
