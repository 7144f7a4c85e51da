"""The router process (launch_router) against stub prefill / decode / worker servers (tests/pd_stubs.py):
the bootstrap fields, the same room to both sides, prefill by cache, decode by load, SSE relay, the
refusals, and faults (a stub that dies or hangs -> an error naming it, not a hang;
health marks it down; it comes back). The router runs as a real subprocess; stubs are in-process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading

import httpx
import pytest

from radixlang_runtime.router.config import RouterArgs, parse_args
from radixlang_runtime.protocol.limits import FieldError
from radixlang_runtime.router.pd_proxy import RelayResponse, check_pd_body, routing_key
from radixlang_runtime.server.http_common import BadRequest
from starlette.requests import ClientDisconnect
from pd_stubs import Stub
from router_utils import BOUND, HEALTH_FLAGS, RouterProcess, wait_for

@pytest.fixture(scope="module")
def pd():
    prefills = [Stub("prefill", bootstrap_port=9101), Stub("prefill", bootstrap_port=9102)]
    decodes = [Stub("decode"), Stub("decode")]
    # the first prefill's bootstrap port comes from the command line, the second's from its /server_info
    router = RouterProcess("--pd-disaggregation", "--prefill", prefills[0].url, "9101", "--prefill", prefills[1].url,
                           "--decode", decodes[0].url, "--decode", decodes[1].url, *HEALTH_FLAGS)
    try:
        wait_for(lambda: all(i["eligible"] for g in router.info()["groups"].values() for i in g["instances"]), 30,
                 lambda: router.info())
        yield router, prefills, decodes
    finally:
        for s in prefills + decodes:
            s.release.set()
        code = router.stop()
        for s in prefills + decodes:
            s.kill()
    assert code == 0, router.tail()


@pytest.fixture()
def fresh(pd):
    """Stubs back to "ok" and listening, all eligible, trees empty, bodies cleared."""
    router, prefills, decodes = pd
    for s in prefills + decodes:
        s.release.set()
        if s._server is None:
            s.restart()
        s.mode, s.release = "ok", threading.Event()
    wait_for(lambda: all(i["eligible"] and i["in_flight"] == 0 for g in router.info()["groups"].values()
                         for i in g["instances"]), 30, lambda: router.info())
    assert httpx.post(router.url + "/flush_cache", timeout=BOUND).status_code == 200
    for s in prefills + decodes:
        with s.lock:
            s.bodies.clear()
    return pd


def gen(url: str, text: str, **extra) -> httpx.Response:
    body = {"text": text, "sampling_params": {"max_new_tokens": 3}, **extra}
    return httpx.post(url + "/generate", json=body, timeout=BOUND)


def the_one(stubs: list[Stub]) -> tuple[int, dict]:
    got = [(i, b) for i, s in enumerate(stubs) for b in s.generate_bodies()]
    assert len(got) == 1, got
    return got[0]


# ---------------------------------------------------------------------------- unit: intake, key, merge
@pytest.mark.parametrize("path,body,name", [
    ("/generate", {"text": ["a"]}, "text"),
    ("/generate", {"input_ids": [[1, 2], [3]]}, "input_ids"),
    ("/generate", {"text": "a", "sampling_params": {"n": 2}}, "sampling_params.n"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
    ("/v1/completions", {"prompt": "a", "n": 3}, "n"),
    ("/v1/chat/completions", {"messages": [], "n": 2}, "n"),
    ("/generate", {"text": "a", "bootstrap_room": 5}, "bootstrap_room"),
])
def test_pd_body_refusals_name_the_field(path, body, name):
    with pytest.raises(FieldError, match=name) as e:
        check_pd_body(path, body)
    assert e.value.param == name
    with pytest.raises(BadRequest, match="JSON object"):
        check_pd_body(path, [body])


def test_pd_body_accepts_single_prompts():
    check_pd_body("/generate", {"text": "a", "sampling_params": {"n": 1}})
    check_pd_body("/generate", {"input_ids": [1, 2, 3]})
    check_pd_body("/v1/completions", {"prompt": [1, 2, 3], "n": 1})


def test_routing_key_is_the_prompt_bytes_or_ids():
    assert routing_key("/generate", {"text": "hé"}) == list("hé".encode())
    assert routing_key("/generate", {"input_ids": [5, 6]}) == [5, 6]
    assert routing_key("/v1/completions", {"prompt": "ab"}) == [97, 98]
    a = routing_key("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    b = routing_key("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"},
                                                          {"role": "assistant", "content": "y"}]})
    assert b[:len(a) - 1] == a[:-1]  # shared leading turns share the key's prefix (up to the closing bracket)


def test_args_refuse_what_they_cannot_honour():
    with pytest.raises(ValueError, match="--prefill and one --decode"):
        RouterArgs(pd_disaggregation=True, prefill=(), decode=())
    with pytest.raises(SystemExit):
        parse_args(["--pd-disaggregation", "--prefill", "http://a:1", "x", "--decode", "http://b:2"])
    with pytest.raises(SystemExit):
        parse_args(["--prefill", "http://a:1", "--decode", "http://b:2"])  # no --pd-disaggregation
    with pytest.raises(SystemExit):
        parse_args(["--worker-urls", "http://a:1", "http://a:1"])
    args = parse_args(["--pd-disaggregation", "--prefill", "http://a:1/", "8998", "--decode", "http://b:2",
                       "--prefill-policy", "round_robin"])
    assert args.prefill[0].url == "http://a:1" and args.prefill[0].bootstrap_port == 8998
    assert args.placement_config("prefill").policy == "round_robin"
    assert args.placement_config("decode").policy == "shortest_queue"


# ---------------------------------------------------------------------------- PD routing
def test_bootstrap_fields_and_the_same_room_to_both(fresh):
    router, prefills, decodes = fresh
    r = gen(router.url, "hello there")
    assert r.status_code == 200, r.text
    assert r.json()["text"] == "AAA"  # the decode's answer
    pi, pb = the_one(prefills)
    di, db = the_one(decodes)
    assert pb["bootstrap_host"] == db["bootstrap_host"] == "127.0.0.1"
    assert pb["bootstrap_port"] == db["bootstrap_port"] == prefills[pi].bootstrap_port
    assert pb["bootstrap_room"] == db["bootstrap_room"] and 0 <= pb["bootstrap_room"] < 2 ** 63
    assert {k: v for k, v in pb.items() if not k.startswith("bootstrap")} == \
        {"path": "/generate", "text": "hello there", "sampling_params": {"max_new_tokens": 3}}
    assert pb == db


def test_bootstrap_port_from_server_info(fresh):
    router, prefills, _ = fresh
    assert router.instance("prefill", prefills[1].url)["bootstrap_port"] == 9102


def test_prefill_follows_the_cache(fresh):
    router, prefills, _ = fresh
    a, b = "A shared few-shot prefix. " * 20, "Another, different prefix! " * 20
    for i in range(4):
        assert gen(router.url, a + f"question {i}").status_code == 200
        assert gen(router.url, b + f"question {i}").status_code == 200
    where_a = {i for i, s in enumerate(prefills) for x in s.generate_bodies() if x["text"].startswith(a)}
    where_b = {i for i, s in enumerate(prefills) for x in s.generate_bodies() if x["text"].startswith(b)}
    assert where_a == {0} and where_b == {1}  # after the flush: the first to 0, the new prefix to the smaller tree
    assert router.info()["groups"]["prefill"]["placement"]["cache_routed"] >= 6


def test_decode_by_load(fresh):
    router, prefills, decodes = fresh
    for d in decodes:
        d.mode = "hold"
    first = threading.Thread(target=gen, args=(router.url, "one"))
    first.start()
    wait_for(lambda: sum(len(d.generate_bodies()) for d in decodes) == 1, 30, "first request not at a decode")
    second = threading.Thread(target=gen, args=(router.url, "one"))  # same prompt: only the load decides
    second.start()
    wait_for(lambda: sum(len(d.generate_bodies()) for d in decodes) == 2, 30, "second request not at a decode")
    assert [len(d.generate_bodies()) for d in decodes] == [1, 1]
    assert [i["in_flight"] for i in router.info()["groups"]["decode"]["instances"]] == [1, 1]
    for d in decodes:
        d.release.set()
    first.join(BOUND)
    second.join(BOUND)


def test_sse_relay_is_the_decodes_stream(fresh):
    router, prefills, decodes = fresh
    body = {"text": "stream me", "stream": True, "return_logprob": True, "sampling_params": {"max_new_tokens": 3}}
    with httpx.stream("POST", router.url + "/generate", json=body, timeout=BOUND) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    room = the_one(decodes)[1]["bootstrap_room"]
    # as the decode sent them (the decode carries input logprobs itself: nothing is merged in)
    assert [json.loads(e) for e in events[:-1]] == decodes[0].answer({"bootstrap_room": room})


def test_openai_routes_relay_the_decode(fresh):
    router, prefills, decodes = fresh
    r = httpx.post(router.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=BOUND)
    assert r.status_code == 200 and r.json()["text"] == "AAA"
    msgs = [{"role": "user", "content": "hi"}]
    with httpx.stream("POST", router.url + "/v1/chat/completions", json={"messages": msgs, "stream": True},
                      timeout=BOUND) as r:
        lines = [x for x in r.iter_lines() if x.startswith("data: ")]
    assert len(lines) == 4 and lines[-1] == "data: [DONE]"
    paths = {b["path"] for s in prefills + decodes for b in s.generate_bodies()}
    assert paths == {"/v1/completions", "/v1/chat/completions"}
    assert httpx.get(router.url + "/v1/models", timeout=BOUND).json()["data"][0]["id"] == "stub-decode"


def test_batch_and_n_refused_by_name(fresh):
    router, prefills, decodes = fresh
    r = httpx.post(router.url + "/generate", json={"text": ["a", "b"]}, timeout=BOUND)
    assert r.status_code == 400 and "batch input" in r.json()["error"]["message"]
    r = httpx.post(router.url + "/v1/completions", json={"prompt": "a", "n": 2}, timeout=BOUND)
    assert r.status_code == 400 and "n > 1" in r.json()["error"]["message"]
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert not any(s.generate_bodies() for s in prefills + decodes)


@pytest.mark.parametrize("spec", ["2.3", "2.4"])
def test_relay_response_ends_on_every_path(spec):
    """The relayed stream's `end` (the load release) runs whether the body ran, was cut, or never started
    (the client gone before the first chunk: ASGI 2.4 servers raise OSError at the first send, 2.3 ones
    report the disconnect at once)."""
    ran: list[str] = []

    async def events():
        try:
            ran.append("started")
            yield b"data: 1\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            ran.append("relay closed")

    async def end() -> None:
        ran.append("end")

    async def gone_receive() -> dict:
        return {"type": "http.disconnect"}

    async def refusing_send(message: dict) -> None:
        raise OSError("client gone")

    async def ok_receive() -> dict:
        await asyncio.sleep(3600)  # the client stays
        return {"type": "http.disconnect"}

    sent: list[dict] = []

    async def ok_send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"spec_version": spec}}
    send = refusing_send if spec == "2.4" else ok_send
    with pytest.raises(ClientDisconnect) if spec == "2.4" else contextlib.nullcontext():
        asyncio.run(RelayResponse(events(), end)(scope, gone_receive, send))
    assert "end" in ran, ran
    assert ("started" in ran) == ("relay closed" in ran), ran  # a relay that started was closed too
    ran.clear()
    asyncio.run(RelayResponse(events(), end)(scope, ok_receive, ok_send))
    assert ran[0] == "started" and "relay closed" in ran and "end" in ran, ran
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


# ---------------------------------------------------------------------------- faults
def test_prefill_killed_mid_transfer(fresh):
    router, prefills, decodes = fresh
    prefills[0].mode = "die"  # after the flush the first request goes to prefill 0
    for d in decodes:
        d.mode = "hold"  # the decode waits for KV that never comes
    r = gen(router.url, "doomed")
    assert r.status_code in (502, 503), r.text
    msg = r.json()["error"]["message"]
    assert prefills[0].url in msg and "prefill" in msg
    wait_for(lambda: not router.instance("prefill", prefills[0].url)["eligible"], 30, "dead prefill still eligible")
    assert [i["in_flight"] for i in router.info()["groups"]["decode"]["instances"]] == [0, 0]
    for d in decodes:
        d.mode = "ok"
        d.release.set()
    r = gen(router.url, "survivors")  # the other prefill serves
    assert r.status_code == 200

    def survivors() -> list[int]:  # a stub decode may answer before the stub prefill logged the body
        return [i for i, s in enumerate(prefills) for b in s.generate_bodies() if b["text"] == "survivors"]
    wait_for(lambda: survivors(), 30, "no prefill got the request")
    assert survivors() == [1]
    prefills[0].restart()
    wait_for(lambda: router.instance("prefill", prefills[0].url)["eligible"], 30, "restarted prefill not back")


def test_decode_killed_mid_stream(fresh):
    router, prefills, decodes = fresh
    decodes[0].mode = "die"
    with httpx.stream("POST", router.url + "/generate", json={"text": "x", "stream": True}, timeout=BOUND) as r:
        body = r.read().decode()
    # the decode died before its headers: a JSON error naming it
    assert r.status_code == 502 and decodes[0].url in json.loads(body)["error"]["message"]
    wait_for(lambda: not router.instance("decode", decodes[0].url)["eligible"], 30, "dead decode still eligible")
    assert gen(router.url, "again").status_code == 200 and len(decodes[1].generate_bodies()) == 1
    m = httpx.get(router.url + "/metrics", timeout=BOUND).text
    assert f'radixlang_router_instance_errors_total{{role="decode",instance="{decodes[0].url}"}} 1' in m
    assert f'radixlang_router_instance_healthy{{role="decode",instance="{decodes[0].url}"}} 0' in m


def test_decode_killed_after_the_first_event(fresh):
    router, prefills, decodes = fresh
    decodes[0].mode = "die_mid_stream"
    with httpx.stream("POST", router.url + "/generate", json={"text": "x", "stream": True}, timeout=BOUND) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and json.loads(events[0])["text"] == "A"
    err = json.loads(events[1])["error"]  # the stream ends well-formed: an error event naming it, then [DONE]
    assert decodes[0].url in err["message"] and err["code"] == 502 and events[2:] == ["[DONE]"]
    wait_for(lambda: not router.instance("decode", decodes[0].url)["eligible"], 30, "dead decode still eligible")


def test_decode_killed_inside_an_event_relays_whole_events_only(fresh):
    """The half-written event of a killed decode is not relayed: the error event stays a line of its own."""
    router, prefills, decodes = fresh
    decodes[0].mode = decodes[1].mode = "die_mid_event"
    with httpx.stream("POST", router.url + "/generate", json={"text": "x", "stream": True}, timeout=BOUND) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and json.loads(events[0])["text"] == "A"
    err = json.loads(events[1])["error"]
    assert err["code"] == 502 and events[2:] == ["[DONE]"], events


def test_client_gone_before_the_first_chunk_releases_the_load(fresh):
    """A client that leaves while the router waits for the decode's stream headers: once the decode answers,
    nothing is relayed, and the decode's and the prefill's load counts go back to 0."""
    router, prefills, decodes = fresh
    for d in decodes:
        d.mode = "hold"  # no headers until released
    raw = json.dumps({"text": "leaving early", "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", router.port), timeout=BOUND) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))
        wait_for(lambda: sum(len(d.generate_bodies()) for d in decodes) == 1, 30, "the request never reached a decode")
        loads = [i["in_flight"] for i in router.info()["groups"]["decode"]["instances"]]
        assert sorted(loads) == [0, 1], loads
    for d in decodes:  # the client is gone: now the decode's stream starts
        d.release.set()
    wait_for(lambda: all(i["in_flight"] == 0 for g in router.info()["groups"].values() for i in g["instances"]), 30,
             lambda: f"load left on an instance: {router.info()}")
    assert gen(router.url, "after").status_code == 200  # and the router serves on


def test_upstream_4xx_passes_through(fresh):
    router, prefills, decodes = fresh
    prefills[0].mode = "reject"
    for d in decodes:
        d.mode = "hold"
    r = gen(router.url, "x")
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_new_tokens"
    assert all(i["eligible"] for i in router.info()["groups"]["prefill"]["instances"])


def test_hung_prefill_fails_by_health_check_and_recovers(fresh):
    router, prefills, decodes = fresh
    prefills[0].mode = "hang"  # generate and /health block, like a stopped process
    for d in decodes:
        d.mode = "hold"  # the decode waits for KV that never comes
    r = gen(router.url, "stuck")
    assert r.status_code == 502, r.text
    assert "did not answer /health" in r.json()["error"]["message"]
    prefills[0].mode = "ok"
    for s in prefills + decodes:
        s.release.set()
    wait_for(lambda: router.instance("prefill", prefills[0].url)["eligible"], 30, "recovered prefill not back")


def test_upstream_500_is_a_502_naming_it(fresh):
    router, prefills, decodes = fresh
    decodes[0].mode = "fail"
    r = gen(router.url, "x")
    assert r.status_code == 502 and "answered 500: stub failure" in r.json()["error"]["message"]


# ---------------------------------------------------------------------------- co-located workers
def test_workers_mode_misconfigured_instance_and_clean_exit():
    good, wrong = Stub("worker"), Stub("worker", mode_in_info="prefill")
    router = RouterProcess("--worker-urls", good.url, wrong.url, "--policy", "round_robin", *HEALTH_FLAGS)
    pid = router.proc.pid
    try:
        wait_for(lambda: "misconfigured" in (router.instance("worker", wrong.url)["reason"] or ""), 30,
                 lambda: router.info())
        for i in range(3):
            assert gen(router.url, f"w{i}").status_code == 200
        assert len(good.generate_bodies()) == 3 and not wrong.generate_bodies()
        assert "bootstrap_room" not in good.generate_bodies()[0]
        # batch input passes through to co-located servers
        assert httpx.post(router.url + "/generate", json={"text": ["a", "b"]}, timeout=BOUND).status_code == 200
        good.kill()
        wait_for(lambda: httpx.get(router.url + "/health", timeout=BOUND).status_code == 503, 30,
                 "router still healthy")
        r = gen(router.url, "nobody")
        assert r.status_code == 503 and "no healthy worker" in r.json()["error"]["message"]
    finally:
        code = router.stop()
        good.kill()
        wrong.kill()
    assert code == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, nothing left behind
