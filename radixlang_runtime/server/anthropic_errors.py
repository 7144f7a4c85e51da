"""Anthropic's error shape and API key header on the Messages routes (/v1/messages, /v1/messages/count_tokens).

Every error those routes answer, whichever layer made it (a handler's 400, routing's 404 / 405, the key
check's 401, IntakeGuard's 413 / 500, a 503 while draining), leaves in Anthropic's shape
`{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}`: AnthropicErrorShape, the
outermost ASGI layer, rewrites the one error shape (http_common.error_body) on those paths, status kept.
A stream that fails after its headers went out sends `event: error` itself (anthropic_api).
The key: with --api-key these routes take `x-api-key: KEY` (Anthropic's header) as well as `Authorization: Bearer`.
"""

from __future__ import annotations

import hmac

import json
from typing import Any, Optional

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def anthropic_route(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def x_api_key_ok(path: str, headers: Any, api_key: str) -> bool:
    """The Messages routes take Anthropic's `x-api-key` header."""
    given = headers.get("x-api-key")
    return anthropic_route(path) and given is not None and hmac.compare_digest(given.encode(), api_key.encode())


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _reshaped(status: int, body: bytes) -> Optional[bytes]:
    """The one error shape -> Anthropic's (None: not that shape, sent as is)."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    err = value.get("error") if isinstance(value, dict) else None
    if value.get("type") == "error" or not isinstance(err, dict) or not isinstance(err.get("message"), str):
        return None
    return json.dumps(anthropic_error(status, err["message"]), ensure_ascii=False).encode()


class AnthropicErrorShape:
    """ASGI: on the Messages routes, a JSON response with status >= 400 is held and its body rewritten."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not anthropic_route(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        start: Optional[Message] = None
        chunks: list[bytes] = []

        async def reshaping_send(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400 and \
                    Headers(raw=message["headers"]).get("content-type", "").startswith("application/json"):
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            body = _reshaped(start["status"], body) or body
            headers = MutableHeaders(raw=list(start["headers"]))
            headers["content-length"] = str(len(body))
            await send({**start, "headers": headers.raw})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, reshaping_send)
