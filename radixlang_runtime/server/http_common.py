"""Shared pieces of the HTTP routes (native, OpenAI) and the DSL's ZeroMQ frontend: the server state,
error shapes, JSON bodies, Server-Sent Events, and the fan-in of several requests' snapshots.

Error shape everywhere: `{"error": {"message", "type", "param", "code"}}`. A stream that fails after
its headers went out sends `data: {"error": ...}` then `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from radixlang_runtime.fim_templates import FimPrompt
from radixlang_runtime.protocol.limits import (MAX_JSON_DEPTH, MAX_PIN_TTL_S, FieldError, need_float, need_int_list,
                                               need_str, show)
from radixlang_runtime.protocol.results import Cumulative
from radixlang_runtime.server.tokenizer_manager import TokenizerManager
from radixlang_runtime.pooling import PoolingConfig
from radixlang_runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)
OPEN_ROUTES = ("/health", "/health_generate", "/ping", "/dashboard")  # no key here (/dashboard checks its own)
METRICS_ROUTE = "/metrics"  # behind the key too, unless --metrics-no-auth (scrapers on a private network)


class BadRequest(ValueError):
    pass


class BodyTooLarge(Exception):
    """The body passed --max-request-body-bytes (HTTP 413)."""


@dataclass
class ServerState:
    args: ServerArgs  # resolved by the scheduler for its device
    tm: TokenizerManager
    model_dir: str
    served_model_name: str
    info: dict[str, Any]  # what the scheduler reported when it became ready
    child_pids: dict[str, int] = field(default_factory=dict)
    frontend: Any = None  # the DSL's ZeroMQ link (frontend_zmq.FrontendServer) while it serves, else None
    flag_template: Optional[str] = None  # --chat-template's text (create_app reads it once), else None
    pooling: Optional[PoolingConfig] = None  # --is-embedding: the model's pooling (pooling.py), else None
    # /v1/completions suffix: the fill-in-the-middle template (--completion-template or told from the tokenizer)
    fim: Optional[FimPrompt] = None


def client_gone_counter(state: ServerState) -> Callable[[], None]:
    """What client_watch.unless_client_gone calls when a client leaves: /metrics' num_client_disconnects."""
    metrics = state.tm.metrics
    return metrics.on_client_disconnect if metrics is not None else (lambda: None)


def chat_template_text(value: Optional[str]) -> Optional[str]:
    """--chat-template as Jinja text: the value itself when it is a template, else the file it names."""
    if value is None or "{%" in value or "{{" in value:
        return value
    with open(value) as f:
        return f.read()


MAX_ERROR_CHARS = 2000


def error_response(status: int, message: str, param: Optional[str] = None, code: Any = None,
                   headers: Optional[dict[str, str]] = None) -> JSONResponse:
    """The one error shape; `code` is the status unless given (OpenAI's "model_not_found"). The message
    is cut to MAX_ERROR_CHARS and made encodable (an echoed lone surrogate must not turn a 400 into a 500)."""
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def error_body(status: int, message: str, param: Optional[str] = None, code: Any = None) -> dict[str, Any]:
    """error_response's body (the ZeroMQ frontend sends it as is)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + "..."
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"error": {"message": message, "type": kind, "param": param, "code": status if code is None else code}}


# Bodies above this many bytes are parsed on a worker thread (the event loop keeps serving meanwhile).
_PARSE_INLINE_BYTES = 1 << 20
_LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # \uD800..\uDFFF: may decode to a lone surrogate


async def read_json(request: Request) -> Any:
    """The request body as JSON, held to I-JSON (RFC 7493): UTF-8 without lone surrogates, finite
    numbers (no NaN / Infinity / 1e400), nesting <= MAX_JSON_DEPTH. The byte cap
    (--max-request-body-bytes) is enforced while the body is read (http_server's IntakeGuard)."""
    body = await request.body()
    if not body:
        return {}
    if len(body) <= _PARSE_INLINE_BYTES:
        return parse_json_body(body)
    return await asyncio.get_running_loop().run_in_executor(None, parse_json_body, body)


def parse_json_body(body: bytes) -> Any:
    """bytes -> JSON value, or BadRequest naming the problem (and where: `messages[1].content`)."""
    try:
        text = body.decode("utf-8")  # strict: also refuses encoded surrogates, which json.loads(bytes) passes
    except UnicodeDecodeError as e:
        raise BadRequest(f"the body is not valid UTF-8 (byte {e.start})") from None
    odd_numbers: list[str] = []

    def number(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            odd_numbers.append(literal)
        return value

    try:
        value = json.loads(text, parse_constant=number, parse_float=number)
    except json.JSONDecodeError as e:
        raise BadRequest(f"the body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest(f"the body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:  # an integer literal of more than 4300 digits
        raise BadRequest(f"the body is not valid JSON: {e}") from None
    surrogates = _LONE_SURROGATE_ESCAPE.search(body) is not None
    if odd_numbers or surrogates or body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH:
        _check_tree(value, bool(odd_numbers), surrogates)
    return value


def _check_tree(value: Any, numbers: bool, strings: bool) -> None:
    """Walks the parsed body (iteratively: it may be deep) for depth, and for non-finite numbers /
    strings and keys that are not valid Unicode when the parse saw such a number / a surrogate escape.
    Raises BadRequest naming where."""
    if not isinstance(value, (list, dict)):
        value, top = [value], True
    else:
        top = False
    look = ({float} if numbers else set()) | ({str} if strings else set())
    stack = [(value, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise BadRequest(f"the body nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(node, dict):
            if strings:
                for k in node:
                    _check_unicode(k, f"the key {show(k)} in {path or 'the body'}")
            entries = [(f"{path}.{_key(k)}" if path else _key(k), v) for k, v in node.items()]
        elif {list, dict, *look}.isdisjoint(map(type, node)):
            continue  # nothing to look at (a long input_ids list ends here, at C speed)
        else:
            entries = [("the body" if top else f"{path}[{i}]", v) for i, v in enumerate(node)]
        for where, v in entries:
            if isinstance(v, (list, dict)):
                stack.append((v, depth + 1, where))
            elif numbers and isinstance(v, float) and not math.isfinite(v):
                raise FieldError(where, f"{where}: {json.dumps(v)} is not a finite number (JSON has no NaN / Infinity)")
            elif strings and isinstance(v, str):
                _check_unicode(v, where)


def _key(k: str) -> str:
    return k if len(k) <= 40 else show(k, 40)


def _check_unicode(s: str, where: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise FieldError(where, f"{where} is not valid Unicode: a lone surrogate at position {e.start}") from None


HTTP_PIN_TTL_S = 600.0  # an HTTP client is not watched: its pin expires after this unless it says otherwise


def parse_pin_body(tm: TokenizerManager, body: Any,
                   default_ttl_s: Optional[float]) -> tuple[list[int], Optional[float]]:
    """A /pin_prefix body: {"text": str} or {"input_ids": [int, ...]}, optional "ttl_s" (seconds in
    (0, MAX_PIN_TTL_S]).
    Returns (input_ids, ttl_s); raises BadRequest naming the field. Tokenizes: run it off the event
    loop (tm.run_intake)."""
    if not isinstance(body, dict) or ("text" in body) == ("input_ids" in body):
        raise BadRequest("pin_prefix needs {\"text\": \"...\"} or {\"input_ids\": [...]} (one of them)")
    if "text" in body:
        ids = tm.encode_text(need_str(body["text"], "text"))
    else:
        ids = need_int_list(body["input_ids"], "input_ids", 0, tm.limits.vocab_size - 1, tm.limits.context_len)
    ttl = body.get("ttl_s", default_ttl_s)
    if ttl is not None:
        ttl = need_float(ttl, "ttl_s")
        if not 0 < ttl <= MAX_PIN_TTL_S:
            raise FieldError("ttl_s", f"ttl_s must be a positive number of seconds up to {MAX_PIN_TTL_S:g} "
                             f"(a day), got {ttl!r}")
    return ids, ttl


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


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
    except Exception as e:  # a bug: the stream still ends well-formed (and the connection stays usable)
        logger.exception("stream failed")
        yield sse({"error": {"message": f"internal error: {e!r}"}})
        yield SSE_DONE


async def final_result(gen: AsyncIterator[dict]) -> Optional[dict]:
    """A request's (delta) snapshots folded into its result: the whole text and output ids, the last meta_info."""
    whole, last = Cumulative(), None
    async for out in gen:
        whole.add(out)
        last = out
    return whole.snapshot(last) if last is not None else None


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
        await asyncio.gather(*tasks, return_exceptions=True)  # stopped: a generator still running cannot aclose
        for g in gens:
            await g.aclose()
