"""Strangers against real PD servers (pd_servers.py's shared set: every member holds the bootstrap secret;
decode 0 also has the prefill allow-list, decode 1 none). A fake prefill (pd_stubs.FakeBootstrap) cannot get
its K/V into either decode; duplicate rooms answer 400 on both roles and leak nothing; a wildcard bootstrap
host answers 400 and PD keeps serving; a forged first token from a peer that holds the secret fails its own
request only; 80 bogus peers leave the decode scheduler's fd count where it was. After each: every pool
whole, and a PD request's greedy text equals the co-located server's."""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import pd_servers
from pd_stubs import FakeBootstrap
from server_utils import free_port
from server_utils import assert_idle_and_whole

pytestmark = pytest.mark.timeout(1800)
T = 600  # client bound per request (a loaded machine)
PROMPT = "The keeper of the northern lighthouse wrote that"


@pytest.fixture(scope="module")
def pd_cluster(request, tmp_path_factory):
    yield from pd_servers.shared(request, tmp_path_factory)


def _body(room: int, port: int, host: str = "127.0.0.1", text: str = PROMPT) -> dict:
    return {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": 8},
            "bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}


def _post(srv, body: dict) -> httpx.Response:
    return httpx.post(srv.url + "/generate", json=body, timeout=T)


def _pd(c, decode, text: str = PROMPT) -> str:
    """A PD request (the router's two posts at once): the decode's text."""
    b = _body(random.getrandbits(63), c.boot, text=text)
    with ThreadPoolExecutor(2) as ex:
        fp, fd = ex.submit(_post, c.prefill, b), ex.submit(_post, decode, b)
        assert fp.result().status_code == 200, fp.result().text
        assert fd.result().status_code == 200, fd.result().text
        return fd.result().json()["text"]


def _colo(c, text: str = PROMPT) -> str:
    r = _post(c.colo, {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
    assert r.status_code == 200, r.text
    return r.json()["text"]


def _pd_stats(srv) -> dict:
    return httpx.get(srv.url + "/server_info", timeout=T).json()["stats"]["disaggregation"]


def _whole_and_same(c) -> None:
    """Every member idle with its pool whole; both decodes answer PROMPT as the co-located server does."""
    want = _colo(c)
    for d in c.decodes:
        assert _pd(c, d) == want
    for srv in (c.prefill, *c.decodes):
        _until(lambda: _pd_stats(srv).get("receiving", 0) == 0 and _pd_stats(srv).get("held", 0) == 0, "PD idle")
        with httpx.Client(base_url=srv.url, timeout=T) as cl:
            assert_idle_and_whole(cl, timeout=120)
        assert httpx.get(srv.url + "/health", timeout=T).status_code == 200


def _until(pred, what: str, bound: float = 120.0) -> None:
    deadline = time.monotonic() + bound
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _error(r: httpx.Response) -> dict:
    return r.json()["error"]


def test_a_fake_prefill_gets_no_kv_into_a_decode(pd_cluster):
    c = pd_cluster
    want = _colo(c)
    fake = FakeBootstrap(first_token=5)
    try:
        r = _post(c.decodes[0], _body(11, fake.port))  # the allow-list: refused before anything connects
        assert r.status_code == 400 and _error(r)["param"] == "bootstrap_host"
        assert f"127.0.0.1:{fake.port} is not a prefill" in _error(r)["message"]
        assert fake.registered == []
        dropped0 = _pd_stats(c.decodes[1])["dropped_messages"]
        r = _post(c.decodes[1], _body(12, fake.port))  # no allow-list: the secret keeps its K/V out
        assert r.status_code == 503 and f"127.0.0.1:{fake.port} is unreachable" in _error(r)["message"]
        assert len(fake.registered) == 1  # it was asked, and answered: K/V, a first token, pongs
        st = _pd_stats(c.decodes[1])
        assert st["dropped_messages"] - dropped0 >= 3 and {"frames", "secret"} <= set(st["dropped_by_reason"])
    finally:
        fake.close()
    for d in c.decodes:
        assert _pd(c, d) == want  # the same prompt: nothing of the fake's is in the radix cache
    _whole_and_same(c)


def test_duplicate_rooms_answer_400_and_leak_nothing(pd_cluster):
    c = pd_cluster
    want = _colo(c)
    for first_at, second_at, other in ((c.decodes[1], c.decodes[1], c.prefill), (c.prefill, c.prefill, c.decodes[1])):
        room = random.getrandbits(63)
        b = _body(room, c.boot)
        first: dict = {}
        t = threading.Thread(target=lambda: first.update(r=_post(first_at, b)))
        t.start()
        key = "receiving" if first_at is not c.prefill else "held"
        _until(lambda: _pd_stats(first_at)[key] == 1, "the first request did not arrive")
        r = _post(second_at, b)
        assert r.status_code == 400 and f"bootstrap_room {room} is already in flight" in _error(r)["message"]
        r_other = _post(other, b)  # the other side of the first: both answer
        t.join(T)
        assert r_other.status_code == 200 and first["r"].status_code == 200, (r_other.text, first["r"].text)
        decode_answer = first["r"] if first_at is not c.prefill else r_other
        assert decode_answer.json()["text"] == want
    _whole_and_same(c)


def test_a_wildcard_bootstrap_host_answers_400_and_pd_keeps_working(pd_cluster):
    c = pd_cluster
    for srv in (c.prefill, *c.decodes):
        for host in ("*", "0.0.0.0", "eth0;127.0.0.1"):
            r = _post(srv, _body(7, c.boot, host=host))
            assert r.status_code == 400 and _error(r)["param"] == "bootstrap_host", r.text
        r = httpx.post(srv.url + "/v1/completions", json={"model": "default", "prompt": "x", "max_tokens": 2,
                                                          "bootstrap_host": "*", "bootstrap_port": c.boot,
                                                          "bootstrap_room": 7}, timeout=T)
        assert r.status_code == 400 and _error(r)["param"] == "bootstrap_host", r.text
    assert all(_pd_stats(d)["link_restarts"] == 0 for d in (c.prefill, *c.decodes))
    _whole_and_same(c)


def test_a_forged_first_token_fails_only_its_request(pd_cluster):
    c = pd_cluster
    want = _colo(c)
    fake = FakeBootstrap(first_token=10**9, key=pd_servers.SECRET)  # a peer holding the secret, misbehaving
    try:
        with ThreadPoolExecutor(2) as ex:
            forged = ex.submit(_post, c.decodes[1], _body(13, fake.port))
            fine = ex.submit(_pd, c, c.decodes[1])
            r = forged.result()
            assert fine.result() == want
        assert r.status_code == 503 and "first token 1000000000 is outside the vocabulary" in _error(r)["message"]
    finally:
        fake.close()
    assert _pd(c, c.decodes[1]) == want  # the forged K/V was freed, never cached
    _whole_and_same(c)


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_eighty_bogus_peers_leave_the_decode_fd_count_where_it_was(pd_cluster):
    c = pd_cluster
    d = c.decodes[1]
    _pd(c, d)  # its link to the prefill is open
    pid = httpx.get(d.url + "/server_info", timeout=T).json()["pids"]["scheduler"]  # the process with the link
    sockets, before = _pd_stats(d)["peer_sockets"], _fds(pid)
    ports = [free_port() for _ in range(80)]  # nothing listens there
    with ThreadPoolExecutor(len(ports)) as ex:  # all at once: each waits out the heartbeat timeout
        answers = list(ex.map(lambda p: _post(d, _body(random.getrandbits(63), p)), ports))
    assert all(r.status_code == 503 and "is unreachable" in _error(r)["message"] for r in answers)
    # <=: the link to the real prefill may itself be closed as idle meanwhile (60 s without a request)
    _until(lambda: _pd_stats(d)["peer_sockets"] <= sockets and _fds(pid) <= before, "sockets not given back", 60)
    print(f"decode scheduler fds: {before} before, {_fds(pid)} after 80 bogus peers")
    assert _fds(pid) <= before
    r = _post(c.decodes[0], _body(1, ports[0]))  # the allow-listed decode never connects to them
    assert r.status_code == 400
    _whole_and_same(c)
