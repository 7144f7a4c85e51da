"""Fault containment through the real server (HTTP + scheduler + detokenizer processes): requests
whose steps fail get a 500 JSON error (native), an SSE error event then [DONE] (streaming), the OpenAI
error shape (/v1) — while a request decoding beside them finishes with its normal output, /health
stays 200, the allocator is whole and the next request works. Faults: RADIXLANG_FAULT_INJECT."""

from __future__ import annotations

import json
import os
import threading

import httpx
import openai
import pytest

from radixlang_runtime.utils.faults import ENV
from server_utils import ServerProcess
from server_utils import assert_idle_and_whole, sse_events

GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
PROMPT = "Once upon a time, in a small village,"


@pytest.fixture(scope="module")
def server():
    os.environ[ENV] = "forward:boom,forward:chatcmpl,detokenize:kaboom"
    try:
        srv = ServerProcess("--dtype", "float32", "--max-total-tokens", "8192", "--debug-check-integrity")
    finally:
        del os.environ[ENV]
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def _stream_in_background(url: str, out: dict) -> threading.Thread:
    started = threading.Event()

    def run():
        body = {"text": PROMPT, "sampling_params": dict(GREEDY, max_new_tokens=64), "stream": True, "rid": "ok-bg"}
        with httpx.Client(base_url=url, timeout=120) as c, c.stream("POST", "/generate", json=body) as r:
            events = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    started.set()
        out["events"] = sse_events(events)

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(60)
    return t


def test_faults_fail_only_their_requests(client, server):
    solo = client.post("/generate", json={"text": PROMPT, "sampling_params": dict(GREEDY, max_new_tokens=64)}).json()
    bg: dict = {}
    t = _stream_in_background(server.url, bg)

    r = client.post("/generate", json={"text": "Hello", "sampling_params": GREEDY, "rid": "boom-native"})
    assert r.status_code == 500, server.tail()
    assert r.status_code == 500 and "injected forward fault" in r.json()["error"]["message"]

    r = client.post("/generate", json={"text": "Hello", "sampling_params": GREEDY, "rid": "kaboom-native"})
    assert r.status_code == 500 and "injected detokenize fault" in r.json()["error"]["message"]

    body = {"text": "Hello", "sampling_params": GREEDY, "rid": "boom-sse", "stream": True}
    with client.stream("POST", "/generate", json=body) as resp:
        events = sse_events(list(resp.iter_lines()))
    assert events[-1] == "[DONE]" and "injected forward fault" in events[-2]["error"]["message"]

    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.InternalServerError, match="injected forward fault"):
        oai.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
    # completions ids are cmpl-...: not injected, served normally next to the failures
    assert oai.completions.create(model="default", prompt="Hi", max_tokens=4).choices[0].text is not None

    t.join(120)
    final = [e for e in bg["events"] if e != "[DONE]"][-1]
    assert final["output_ids"] == solo["output_ids"]  # the neighbour's output is untouched
    assert client.get("/health").status_code == 200
    ok = client.post("/generate", json={"text": "Hello", "sampling_params": GREEDY})
    assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 24
    assert_idle_and_whole(client)
    assert json.loads(json.dumps(client.get("/server_info").json()["stats"]["cpu"]))["paths"] is not None
