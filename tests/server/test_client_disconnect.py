"""A non-streaming request ends with its client (server/client_watch.py): on each generate route (native
/generate, /v1/completions, /v1/chat/completions; directly and through the router) a client that closes its
socket mid-decode gets its request aborted, counted in /metrics, the pool whole after. (Without the watch the
request decodes on for minutes: the bound fails.) Real server, the
embedded model, a raw socket (the client really goes away)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from router_utils import HEALTH_FLAGS, RouterProcess
from server_utils import ServerProcess
from server_utils import assert_idle_and_whole

LONG = 4000  # tokens: far more than the test waits for
BODIES = {
    "/generate": {"text": "Count slowly:", "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True}},
    "/v1/completions": {"model": "default", "prompt": "Count slowly:", "max_tokens": LONG, "ignore_eos": True},
    "/v1/chat/completions": {"model": "default", "messages": [{"role": "user", "content": "Count slowly."}],
                             "max_tokens": LONG, "ignore_eos": True},
}
# the disconnect to the request gone from the scheduler: at once plus one step (figures: docs/SERVER_SECURITY.md);
# the bound is generous (a loaded CI machine) and still far below the minutes the 4,000 tokens would decode
ABORT_BOUND_S = 10.0


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--max-total-tokens", "8192", "--enable-metrics")
    yield srv
    srv.stop()


def _metric(srv, name: str) -> float:
    for line in httpx.get(srv.url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " ") or (name.endswith("{") and line.startswith(name)):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def _running(srv) -> int:
    return httpx.get(srv.url + "/server_info", timeout=30).json()["stats"]["num_running_reqs"]


def _wait(cond, timeout: float, what: str) -> float:
    """Seconds until cond() held (AssertionError naming `what` after timeout)."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, what
        time.sleep(0.02)
    return time.monotonic() - t0


def _send_and_leave(url: str, path: str, backend) -> float:
    """POST path on a raw socket, wait until backend runs the request, close the socket; seconds until the
    backend no longer runs it."""
    host, port = url.rsplit("/", 1)[-1].split(":")
    body = json.dumps(BODIES[path]).encode()
    sock = socket.create_connection((host, int(port)), timeout=10)
    try:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        _wait(lambda: _running(backend) == 1, 60, f"{path}: the request never ran")
        time.sleep(0.3)  # decoding for a while
        assert _running(backend) == 1
    finally:
        sock.close()
    return _wait(lambda: _running(backend) == 0, 30, f"{path}: still decoding after the client left")


@pytest.mark.parametrize("path", list(BODIES))
def test_a_disconnected_non_streaming_request_is_aborted(server, path):
    gone = _metric(server, "radixlang:num_client_disconnects_total")
    aborted = _metric(server, "radixlang:num_aborted_requests_total")
    took = _send_and_leave(server.url, path, server)
    assert took < ABORT_BOUND_S, f"{path}: aborted {took:.2f} s after the disconnect"
    _wait(lambda: _metric(server, "radixlang:num_client_disconnects_total") == gone + 1, 10, "not counted")
    assert _metric(server, "radixlang:num_aborted_requests_total") == aborted + 1
    assert _metric(server, "sglang:num_client_disconnects_total{") == gone + 1
    with httpx.Client(base_url=server.url, timeout=60) as client:
        assert_idle_and_whole(client)
        r = client.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 4}})
        assert r.status_code == 200  # still serving


def test_through_the_router_the_upstream_leg_is_cancelled(server):
    router = RouterProcess("--worker-urls", server.url, *HEALTH_FLAGS)
    try:
        gone = _metric(server, "radixlang:num_client_disconnects_total")
        took = _send_and_leave(router.url, "/v1/completions", server)
        assert took < ABORT_BOUND_S, f"aborted {took:.2f} s after the disconnect"
        text = httpx.get(router.url + "/metrics", timeout=30).text
        assert "radixlang_router_client_disconnects_total 1" in text.splitlines()
        assert _metric(server, "radixlang:num_client_disconnects_total") == gone + 1  # the server saw it too
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert_idle_and_whole(client)
    finally:
        router.stop()
