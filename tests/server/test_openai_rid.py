"""SGLang's `rid` on the OpenAI routes (a real server, the embedded model): it is the response's id and the
runtime request id of a single choice, so /abort_request ends a streamed chat by it; several choices run as
f"{rid}-{index}"; a rid in use or not a non-empty string is a 400 naming it."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from server_utils import FP32_FLAGS, assert_idle_and_whole, shared_server

ASK = [{"role": "user", "content": "Write a long story about a dragon."}]


@pytest.fixture(scope="module")
def server():
    return shared_server(*FP32_FLAGS)


def test_the_rid_is_the_responses_id(server):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120,
                   json={"messages": ASK, "max_tokens": 3, "rid": "chat-rid-1"})
    assert r.status_code == 200 and r.json()["id"] == "chat-rid-1", r.text
    r = httpx.post(server.url + "/v1/completions", timeout=120,
                   json={"prompt": "Hello", "max_tokens": 3, "n": 2, "rid": "cmpl-rid-2"})
    assert r.status_code == 200 and r.json()["id"] == "cmpl-rid-2", r.text
    assert len(r.json()["choices"]) == 2


def test_abort_request_ends_a_streamed_chat_by_its_rid(server):
    body = {"messages": ASK, "max_tokens": 2000, "stream": True, "rid": "to-abort", "temperature": 0,
            "ignore_eos": True}
    finish, chunks = [], 0
    with httpx.Client(base_url=server.url, timeout=120) as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()  # kept referenced: a dropped iterator would close the stream
        for line in lines:
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            assert ev["id"] == "to-abort"
            chunks += 1
            if chunks == 3:  # decoding: a second request with the same rid is refused, then abort it
                dup = c.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2, "rid": "to-abort"})
                assert dup.status_code == 400 and dup.json()["error"]["param"] == "rid", dup.text
                threading.Thread(target=lambda: c.post("/abort_request", json={"rid": "to-abort"})).start()
            finish += [ch["finish_reason"] for ch in ev["choices"] if ch.get("finish_reason")]
    assert finish == ["abort"] and chunks < 1000
    with httpx.Client(base_url=server.url, timeout=30) as c:
        assert_idle_and_whole(c)


@pytest.mark.parametrize("rid", ["", 7, ["a"], "x" * 1000])
def test_a_bad_rid_is_a_400_naming_it(server, rid):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={"messages": ASK, "max_tokens": 2, "rid": rid})
    assert r.status_code == 400 and r.json()["error"]["param"] == "rid", r.text
