"""HttpBackend: the native protocol over HTTP (`RuntimeEndpoint("http://host:port")`), stdlib only.

Works against radixlang's server and a real SGLang server. One keep-alive connection per calling
thread. A connection is opened within `connect_timeout` (CONNECT_TIMEOUT_S at most): no server at
the URL raises UnreachableError naming it at once. Every read is bounded by `timeout`
(global_config.request_timeout by default); a refused request raises BackendError with the server's
status and message; a connection that drops raises at once. A stream the consumer leaves early
closes its connection (the server aborts the request). A reused keep-alive connection that the
server closed meanwhile is retried once on a fresh one.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
from typing import Any, Iterator, Optional

from radixlang.backend.native import NativeBackend
from radixlang.errors import BackendError, UnreachableError
from radixlang.global_config import global_config

_ROUTES = {  # control method -> (HTTP method, path)
    "model_info": ("GET", "/get_model_info"),
    "server_info": ("GET", "/server_info"),
    "flush_cache": ("POST", "/flush_cache"),
    "concate_and_append": ("POST", "/concate_and_append_request"),
    "pin_prefix": ("POST", "/pin_prefix"),
    "unpin_prefix": ("POST", "/unpin_prefix"),
    "abort": ("POST", "/abort_request"),
}
CONNECT_TIMEOUT_S = 10.0  # a TCP (+ TLS) connect; the kernel accepts for a live server however busy it is


class HttpBackend(NativeBackend):
    transport = "http"

    def __init__(self, base_url: str, api_key: Optional[str] = None, verify: Any = None,
                 chat_template_name: Optional[str] = None, timeout: Optional[float] = None):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.verify = verify
        self.timeout = timeout or global_config.request_timeout
        self.connect_timeout = min(self.timeout, CONNECT_TIMEOUT_S)
        self._https = u.scheme == "https"
        self._host, self._port = u.hostname, u.port or (443 if self._https else 80)
        self._base_path = u.path.rstrip("/")
        self._local = threading.local()
        super().__init__(chat_template_name)

    # ------------------------------------------------------------------ connections
    def _new_conn(self) -> http.client.HTTPConnection:
        if self._https:
            import ssl

            ctx = ssl.create_default_context(cafile=self.verify if isinstance(self.verify, str) else None)
            if self.verify is False:
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            return http.client.HTTPSConnection(self._host, self._port, timeout=self.connect_timeout, context=ctx)
        return http.client.HTTPConnection(self._host, self._port, timeout=self.connect_timeout)

    def _connect(self) -> http.client.HTTPConnection:
        """A connected connection (within connect_timeout) whose reads then wait up to `timeout`."""
        conn = self._new_conn()
        try:
            conn.connect()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise UnreachableError(f"cannot reach {self.base_url}: {self._why_unreachable(e)}") from e
        conn.timeout = self.timeout
        conn.sock.settimeout(self.timeout)
        return conn

    def _why_unreachable(self, e: BaseException) -> str:
        where = f"{self._host}:{self._port}"
        if isinstance(e, ConnectionRefusedError):
            return f"connection refused: nothing listens at {where} (is the server running?)"
        if isinstance(e, socket.gaierror):
            return f"unknown host {self._host!r} ({e.strerror})"
        if isinstance(e, TimeoutError):
            return f"no connection to {where} within {self.connect_timeout:g} s"
        return f"{where}: {e!r}"

    def _drop_conn(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def _send(self, method: str, path: str, body: Any = None) -> http.client.HTTPResponse:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        for attempt in (0, 1):
            conn = getattr(self._local, "conn", None)
            if conn is not None and conn.sock is None:  # http.client closed it after a `Connection: close` answer
                conn = self._local.conn = None
            reused = conn is not None
            if conn is None:
                conn = self._local.conn = self._connect()
            try:
                conn.request(method, self._base_path + path, body=data, headers=headers)
                return conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self._drop_conn()
                if reused and attempt == 0:
                    continue  # the server closed an idle keep-alive connection
                raise BackendError(f"lost the connection to {self.base_url}: {e!r}") from e
            except (OSError, http.client.HTTPException) as e:  # refused, timed out, ...
                self._drop_conn()
                raise BackendError(f"cannot reach {self.base_url}{path}: {e!r}") from e
        raise AssertionError("unreachable")

    def _read(self, resp: http.client.HTTPResponse, path: str) -> bytes:
        try:
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            self._drop_conn()
            raise BackendError(f"lost the connection to {self.base_url} reading {path}: {e!r}") from e
        if resp.getheader("connection", "").lower() == "close":
            self._drop_conn()
        if resp.status != 200:
            raise BackendError(f"{path} answered {resp.status}: {_error_message(data)}", resp.status)
        return data

    # ------------------------------------------------------------------ transport
    def _call(self, body: dict) -> Any:
        return json.loads(self._read(self._send("POST", "/generate", body), "/generate"))

    def _call_stream(self, body: dict) -> Iterator[dict]:
        resp = self._send("POST", "/generate", body)
        if resp.status != 200:
            self._read(resp, "/generate")  # raises with the server's message
        done = False
        try:
            while True:
                try:
                    line = resp.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise BackendError(f"lost the connection to {self.base_url} mid-stream: {e!r}") from e
                if not line:
                    raise BackendError(f"{self.base_url} closed the stream before [DONE]")
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    resp.read()  # the chunked body's terminator, so the connection can be reused
                    return
                yield json.loads(payload)
        finally:
            if not done:  # error, or the consumer left early: closing the socket aborts the request
                self._drop_conn()

    def _control(self, method: str, body: Optional[dict] = None) -> Any:
        verb, path = _ROUTES[method]
        resp = self._send(verb, path, body)
        if method == "flush_cache" and resp.status == 400:
            self._read_quietly(resp)
            return False
        data = self._read(resp, path)
        if method == "flush_cache":
            return True
        try:
            return json.loads(data) if data else {}
        except ValueError:
            return data.decode(errors="replace")

    def _read_quietly(self, resp: http.client.HTTPResponse) -> None:
        try:
            resp.read()
        except (OSError, http.client.HTTPException):
            self._drop_conn()


def _error_message(data: bytes) -> str:
    try:
        obj = json.loads(data)
    except ValueError:
        return data.decode(errors="replace")[:500]
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(err)
    return str(obj)
