"""One leg of a routed request: a POST to one instance, every failure an UpstreamError naming the
instance and why (refused, connection lost, timed out, 5xx); an upstream 4xx passes through with its
own body (the client's mistake, found by the server). Every call is bounded: --connect-timeout-secs
to connect, --request-timeout-secs for the rest (streams: between two chunks)."""

from __future__ import annotations

import json
from typing import Any, Optional

import httpx

from radixlang_runtime.router.config import RouterArgs
from radixlang_runtime.router.instances import Instance, UpstreamError


def timeouts(args: RouterArgs) -> httpx.Timeout:
    return httpx.Timeout(args.request_timeout_secs, connect=args.connect_timeout_secs)


def transport_error(inst: Instance, e: Exception, args: RouterArgs) -> UpstreamError:
    if isinstance(e, httpx.ConnectTimeout):
        return UpstreamError(inst, f"did not accept the connection within {args.connect_timeout_secs} s", 503)
    if isinstance(e, httpx.ConnectError):
        return UpstreamError(inst, f"refused the connection ({e})", 503)
    if isinstance(e, httpx.TimeoutException):
        return UpstreamError(inst, f"sent nothing for {args.request_timeout_secs} s (--request-timeout-secs)", 504)
    return UpstreamError(inst, f"lost the connection mid-request ({type(e).__name__}: {e})")


def _error_message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message"))
    return str(body)[:500]


def status_error(inst: Instance, status: int, raw: bytes) -> UpstreamError:
    try:
        body = json.loads(raw)
    except ValueError:
        body = raw.decode("utf-8", "replace")
    if 400 <= status < 500:
        return UpstreamError(inst, f"refused the request ({status}): {_error_message(body)}", status,
                             body if isinstance(body, dict) and "error" in body else None)
    return UpstreamError(inst, f"answered {status}: {_error_message(body)}")


def parse_answer(inst: Instance, raw: bytes) -> dict:
    """A whole answer: a JSON object, or an SSE stream (its last data event); an error event fails."""
    text = raw.decode("utf-8", "replace").lstrip()
    if not text.startswith("data:"):
        try:
            value = json.loads(text)
        except ValueError:
            raise UpstreamError(inst, f"answered something that is not JSON: {text[:200]!r}") from None
        if not isinstance(value, dict):
            raise UpstreamError(inst, f"answered JSON that is not an object: {text[:200]!r}")
        return value
    last: dict = {}
    for event in text.split("\n\n"):
        data = event.strip()[5:].strip() if event.strip().startswith("data:") else ""
        if not data or data == "[DONE]":
            continue
        try:
            value = json.loads(data)
        except ValueError:
            raise UpstreamError(inst, f"sent an event that is not JSON: {data[:200]!r}") from None
        if isinstance(value, dict) and "error" in value:
            raise UpstreamError(inst, f"failed mid-stream: {_error_message(value)}")
        last = value if isinstance(value, dict) else last
    return last


async def post_whole(client: httpx.AsyncClient, inst: Instance, path: str, body: dict, args: RouterArgs) -> dict:
    """POST and read the whole answer (JSON or SSE); 2xx -> the answer object, else UpstreamError."""
    try:
        r = await client.post(inst.url + path, json=body, timeout=timeouts(args))
    except httpx.HTTPError as e:
        raise transport_error(inst, e, args) from None
    if r.status_code != 200:
        raise status_error(inst, r.status_code, r.content)
    return parse_answer(inst, r.content)


async def open_stream(client: httpx.AsyncClient, inst: Instance, path: str, body: dict,
                      args: RouterArgs) -> httpx.Response:
    """POST and return once the headers are in (status 200; else UpstreamError with its body read).
    The caller reads and closes the response."""
    req = client.build_request("POST", inst.url + path, json=body, timeout=timeouts(args))
    try:
        r = await client.send(req, stream=True)
    except httpx.HTTPError as e:
        raise transport_error(inst, e, args) from None
    if r.status_code != 200:
        try:
            raw = await r.aread()
        except httpx.HTTPError:
            raw = b""
        finally:
            await r.aclose()
        raise status_error(inst, r.status_code, raw)
    return r


async def next_chunk(it: Any, inst: Instance, args: RouterArgs) -> Optional[bytes]:
    """The stream's next bytes, None at its end; a broken stream -> UpstreamError."""
    try:
        return await it.__anext__()
    except StopAsyncIteration:
        return None
    except httpx.HTTPError as e:
        raise transport_error(inst, e, args) from None
