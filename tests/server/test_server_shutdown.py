"""The server process's lifecycle (real processes, the real model): SIGTERM drains (new work and
/health get 503 JSON, the requests in flight finish or end with a JSON error / an SSE error event then
[DONE], the process exits 0 with no child left), SIGKILL of the server leaves no child behind
(PR_SET_PDEATHSIG), and /health reports a scheduler stuck in a step (RADIXLANG_FAULT_INJECT stall),
then recovers. Plus the flags' validation and the Lifecycle verdicts as units.

No assertion on elapsed time: each check waits, with a generous bound, for the condition itself. A
legitimate step of the embedded model takes well under a second on a loaded 2-core machine, the stall
timeout is 5 s (heartbeats come every 0.5 s), an injected stall lasts 15 s, the drain 12 s."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Optional

import httpx
import psutil
import pytest
import zmq

from radixlang_runtime.utils.faults import ENV
from radixlang_runtime.protocol.messages import FrontendOut, FrontendReq, decode, encode
from radixlang_runtime.server.lifecycle import SHUTTING_DOWN, Lifecycle, RuntimeUnavailable, ShuttingDown
from radixlang_runtime.server_args import ServerArgs
from server_utils import ServerProcess, alive, free_port, wait_gone

DRAIN_S = 12  # --graceful-shutdown-timeout of the shared server
STALL_TIMEOUT_S = 4  # --health-stall-timeout of the shared server
STALL_S = 9  # an injected step of a "stall-" request sleeps this long, once
# New tokens: the signal comes when every short stream is at most 4 tokens from its end (arrivals may
# spread over a few steps), so the short requests finish inside the drain even on a loaded machine (a
# few steps of 20 requests); a long one cannot (10 requests decoding 1,500 tokens each in 12 s is 1,250
# tok/s of the 135M model, several times what 2 CPU cores do).
SHORT, LONG = 24, 1500
GREEDY = {"temperature": 0, "ignore_eos": True}


# ---------------------------------------------------------------------------------------- units
def test_flags_are_checked():
    assert ServerArgs().graceful_shutdown_timeout > 0 and ServerArgs().health_stall_timeout >= 1
    for bad in ({"graceful_shutdown_timeout": -1}, {"graceful_shutdown_timeout": float("nan")},
                {"health_stall_timeout": 0.5}, {"health_stall_timeout": float("inf")}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ServerArgs(**bad)


def test_lifecycle_admission_and_health_verdicts():
    lc = Lifecycle(num_replicas=2, stall_timeout_s=5.0)
    lc.admit()
    t0 = lc.heartbeat_at[0]
    assert lc.unhealthy([3, 0], now=t0 + 4) is None
    assert lc.unhealthy([0, 0], now=t0 + 100) is None  # nothing waits: quiet is not stuck
    assert "replica 1 made no progress for 100 s with 2 request(s)" in lc.unhealthy([0, 2], now=t0 + 100)
    lc.draining = True
    with pytest.raises(ShuttingDown, match=f"^{SHUTTING_DOWN}$"):
        lc.admit()
    assert lc.unhealthy([0, 0]) == SHUTTING_DOWN
    lc.dead = "scheduler exited with code -9"
    with pytest.raises(RuntimeUnavailable, match="code -9") as e:
        lc.admit()
    assert type(e.value) is RuntimeUnavailable and lc.unhealthy([0, 0]) == lc.dead


# ---------------------------------------------------------------------------------------- helpers
def descendants(pid: int) -> list[int]:
    """Every process below pid: children and grandchildren (grammar compile children, the resource tracker)."""
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def record(out: dict, key: str, fn) -> threading.Thread:
    """Run fn() in a thread; out[key] = its result, or the exception (a reset, a timeout) it raised."""
    def run():
        try:
            out[key] = fn()
        except Exception as e:  # noqa: BLE001 - asserted on by the test
            out[key] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def post(url: str, path: str, body: dict, start: Optional[threading.Barrier] = None) -> httpx.Response:
    """POST on a client of its own; `start`: send once every thread of the barrier is ready."""
    with httpx.Client(base_url=url, timeout=120) as c:
        if start is not None:
            start.wait(30)
        return c.post(path, json=body)


def stream(url: str, path: str, body: dict, start: Optional[threading.Barrier] = None,
           events: Optional[list] = None) -> tuple[httpx.Response, list]:
    """An SSE request; its events ("[DONE]" or the decoded JSON) are appended to `events` as they come."""
    events = [] if events is None else events
    with httpx.Client(base_url=url, timeout=120) as c:
        if start is not None:
            start.wait(30)
        with c.stream("POST", path, json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
            return r, events


def poll(fn, until, timeout: float, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if until(v):
            return v
        assert time.monotonic() < deadline, f"condition not met after {timeout} s; last: {v!r}"
        time.sleep(every)


def frontend_generate(address: str, body: dict) -> FrontendOut:
    """One generate over the DSL's ZeroMQ link (a DEALER, as the DSL's ZmqBackend): its reply."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.send(encode(FrontendReq("late-1", "generate", body)))
        assert sock.poll(10_000), "no reply from the frontend socket"
        return decode(sock.recv())
    finally:
        sock.close()
        ctx.term()


def assert_refused_json(r: httpx.Response) -> None:
    assert r.status_code == 503 and r.headers["content-type"] == "application/json", (r.status_code, r.text)
    assert r.json()["error"]["message"] == SHUTTING_DOWN and r.json()["error"]["code"] == 503


# ---------------------------------------------------------------------------------------- one server
@pytest.fixture(scope="module")
def server():
    """Shared by the health test and then the SIGTERM test, which ends it (so it runs last)."""
    os.environ[ENV] = f"forward:stall-:stall={STALL_S}"
    frontend_port = free_port()
    try:
        srv = ServerProcess("--max-total-tokens", "16384", "--graceful-shutdown-timeout", str(DRAIN_S),
                            "--health-stall-timeout", str(STALL_TIMEOUT_S), "--frontend-port", str(frontend_port),
                            new_session=True)
    finally:
        del os.environ[ENV]
    srv.frontend_address = f"tcp://127.0.0.1:{frontend_port}"  # the DSL's ZeroMQ link
    yield srv
    srv.stop()


def test_health_reports_a_stuck_scheduler_then_recovers(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        def health():
            return c.get("/health")
        assert health().status_code == 200
        # A normal request decoding for twice the stall timeout without a token message (not streamed):
        # the heartbeats keep /health 200 throughout. Then it is aborted.
        out: dict = {}
        t = record(out, "busy", lambda: post(server.url, "/generate", {
            "text": "Count:", "rid": "busy-1", "sampling_params": {**GREEDY, "max_new_tokens": 4000}}))
        poll(lambda: c.get("/server_info").json()["stats"]["num_running_reqs"], lambda n: n == 1, timeout=60)
        time.sleep(1.0)  # past its prefill: the window below sees decode steps only
        t0, codes = time.monotonic(), []
        while time.monotonic() - t0 < STALL_TIMEOUT_S + 2:
            codes.append(health().status_code)
            time.sleep(0.2)
        assert t.is_alive() and set(codes) == {200}, codes
        c.post("/abort_request", json={"rid": "busy-1"})
        t.join(60)
        assert out["busy"].status_code == 200 and out["busy"].json()["meta_info"]["finish_reason"]["type"] == "abort"

        # A step that hangs (STALL_S seconds): 503 naming the stall while the step has not returned (the
        # request is still waiting on it; once it returns, /health is 200 again and the poll fails).
        t = record(out, "stuck", lambda: post(server.url, "/generate", {
            "text": "Hello", "rid": "stall-1", "sampling_params": {**GREEDY, "max_new_tokens": 4}}))
        r = poll(health, lambda r: r.status_code == 503, timeout=STALL_S + 30)
        assert t.is_alive()
        assert "made no progress" in r.json()["error"]["message"], r.text
        t.join(STALL_S + 60)
        assert out["stuck"].status_code == 200 and out["stuck"].json()["meta_info"]["completion_tokens"] == 4
        poll(health, lambda r: r.status_code == 200, timeout=5)


def test_sigterm_to_the_group_drains_then_exits_0_with_no_child_left(server):
    url = server.url
    out: dict = {}
    live = {f"short-sse-{i}": [] for i in range(5)}  # those streams' events so far
    short = {"sampling_params": {**GREEDY, "max_new_tokens": SHORT}}
    long = {"sampling_params": {**GREEDY, "max_new_tokens": LONG}}
    sse = {"stream": True}
    go = threading.Barrier(20)  # all sent at once: the short ones are still decoding when the count is seen
    requests = {"chat-sse": lambda: stream(url, "/v1/chat/completions", {
        "model": "default", "messages": [{"role": "user", "content": "Tell a long story."}], "stream": True,
        "max_tokens": LONG, "temperature": 0}, go)}
    for i in range(5):  # 20 requests: short ones finish inside the drain, long ones are cut at its end
        requests[f"short-plain-{i}"] = lambda i=i: post(url, "/generate", {"text": f"A{i}:", **short}, go)
        requests[f"short-sse-{i}"] = lambda i=i: stream(url, "/generate", {"text": f"B{i}:", **short, **sse}, go,
                                                        live[f"short-sse-{i}"])
        requests[f"long-plain-{i}"] = lambda i=i: post(url, "/generate", {"text": f"C{i}:", **long}, go)
        if i < 4:
            requests[f"long-sse-{i}"] = lambda i=i: stream(url, "/generate", {"text": f"D{i}:", **long, **sse}, go)
    assert len(requests) == 20
    threads = [record(out, key, fn) for key, fn in requests.items()]
    with httpx.Client(base_url=url, timeout=30) as c:
        def in_flight() -> int:
            stats = c.get("/server_info").json()["stats"]
            return stats["num_running_reqs"] + stats["num_waiting_reqs"]

        poll(in_flight, lambda n: n == 20, timeout=60, every=0.05)  # all admitted
        children = descendants(server.proc.pid)
        assert len(children) >= 3  # scheduler, detokenizer, multiprocessing's resource tracker
        poll(lambda: min(len(e) for e in live.values()), lambda n: n >= SHORT - 4, timeout=120, every=0.02)
        assert all("[DONE]" not in e for e in live.values())  # still decoding: the drain has to finish them
        # To the server's whole process group, as `timeout` or a terminal's Ctrl+C (SIGINT) sends it: the
        # children left that group (child_process.py), so only the server gets it, and drains.
        os.killpg(server.proc.pid, signal.SIGTERM)

        # Draining: /health and every route that creates work answer 503 JSON (a stream too: no headers
        # went out), the ZeroMQ frontend's generate too, while the requests in flight go on.
        r = poll(lambda: c.get("/health"), lambda r: r.status_code == 503, timeout=5)
        assert r.json()["error"]["message"] == SHUTTING_DOWN
        assert_refused_json(c.post("/generate", json={"text": "late", "sampling_params": {"max_new_tokens": 2}}))
        assert_refused_json(c.post("/generate", json={"text": "late", "stream": True}))
        assert_refused_json(c.post("/v1/completions", json={"model": "default", "prompt": "late", "max_tokens": 2}))
        assert_refused_json(c.post("/v1/chat/completions", json={
            "model": "default", "messages": [{"role": "user", "content": "late"}], "stream": True}))
        reply = frontend_generate(server.frontend_address, {"text": "late", "stream": True})
        assert (reply.status, reply.body["error"]["message"], reply.done) == (503, SHUTTING_DOWN, True)
        # (all of that inside the drain: a server that had exited would have refused the connections)

    assert server.proc.wait(DRAIN_S + 60) == 0, server.tail()  # exits by itself after the drain
    wait_gone(children, timeout=5)
    with pytest.raises(httpx.ConnectError):  # after the drain the listener is closed
        httpx.get(url + "/health", timeout=5)
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    _assert_outcomes(out)


def _assert_outcomes(out: dict) -> None:
    """Short requests finished whole; long ones ended with the drain's error in the documented shape."""
    errors = {k: v for k, v in out.items() if isinstance(v, Exception)}
    assert not errors, errors  # no reset connection, no hang
    for key, v in out.items():
        if key.startswith("short-plain"):
            assert v.status_code == 200 and v.json()["meta_info"]["completion_tokens"] == SHORT, (key, v.text)
        elif key.startswith("short-sse"):
            resp, events = v
            assert resp.status_code == 200 and events[-1] == "[DONE]", (key, events[-3:])
            assert events[-2]["meta_info"]["finish_reason"]["type"] == "length", (key, events[-2])
            assert events[-2]["meta_info"]["completion_tokens"] == SHORT
        elif key.startswith("long-plain"):
            assert v.status_code == 503 and v.headers["content-type"] == "application/json", (key, v.text)
            assert v.json()["error"]["message"].startswith(SHUTTING_DOWN + ": the request did not finish")
        else:  # long-sse-*, chat-sse: tokens, then the error event, then [DONE]
            resp, events = v
            assert resp.status_code == 200 and events[-1] == "[DONE]", (key, events[-3:])
            assert events[-2]["error"]["message"].startswith(SHUTTING_DOWN + ": the request did not finish"), key
            assert len(events) >= 3 and "error" not in events[0], (key, events[:2])  # it did decode meanwhile


# ---------------------------------------------------------------------------------------- SIGKILL
def test_sigkill_of_the_server_leaves_no_child():
    """--tp-size 2 (a TP rank process), a grammar request (compile children of the scheduler), a long
    request decoding (a busy scheduler): after SIGKILL of the server process, every descendant is gone
    (PR_SET_PDEATHSIG fires at once; without it they would live on: the bound only allows for a loaded
    machine's scheduling)."""
    srv = ServerProcess("--tp-size", "2", "--max-total-tokens", "4096", "--graceful-shutdown-timeout", "0")
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            r = c.post("/generate", json={"text": "Pick:", "sampling_params": {"max_new_tokens": 3, "regex": "[0-9]+"}})
            assert r.status_code == 200 and r.json()["text"].isdigit(), r.text
            pids = c.get("/server_info").json()["pids"]
            out: dict = {}
            t = record(out, "long", lambda: post(srv.url, "/generate", {
                "text": "Go on:", "sampling_params": {**GREEDY, "max_new_tokens": 3000}}))
            poll(lambda: c.get("/server_info").json()["stats"]["num_running_reqs"], lambda n: n == 1, timeout=60)
        children = descendants(srv.proc.pid)
        cmdlines = " ".join(" ".join(psutil.Process(p).cmdline()) for p in children)
        assert {pids["scheduler"], pids["detokenizer"], pids["tp0.1"]} <= set(children)
        assert "worker_child" in cmdlines and "resource_tracker" in cmdlines, cmdlines
        srv.proc.kill()
        srv.proc.wait(10)
        wait_gone(children, timeout=15)
        t.join(30)
        assert isinstance(out["long"], httpx.HTTPError)  # the server is gone: its connection closed
        assert not any(alive(p) for p in children)
    finally:
        srv.stop()
