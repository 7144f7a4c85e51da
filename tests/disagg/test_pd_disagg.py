"""Prefill-decode disaggregation through real servers: one prefill + one decode server (each its own
launch_server with its processes), every body posted to both with the router's bootstrap fields (the
router itself is launch_router; a two-post helper stands in for it here), compared with a co-located
server on the same weights in float32: greedy output identical (text, ids, finish reason, logprobs),
constrained and OpenAI requests included; the decode's radix cache saves transfers; the intake refuses
what PD does not take; both allocators are whole after every request. The servers are pd_servers.py's
shared set (a tiny float32 checkpoint), also used by test_pd_e2e and test_pd_faults."""

from __future__ import annotations

import json
import os
import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import pd_servers
from server_utils import assert_idle_and_whole

# The shared servers start in the first PD file's fixture: on a loaded 2-core machine that alone can take minutes.
pytestmark = pytest.mark.timeout(1800)

# The full run is 64 (RADIXLANG_PD_PARITY_N=64); the suite runs 8 (each kind of body once).
PARITY_N = int(os.environ.get("RADIXLANG_PD_PARITY_N", "8"))
T = 600  # client bound per request (a loaded machine; grammars compile on first use)
IDLE_S = 120  # bound on a server going idle after its requests answered (a loaded machine)
WORDS = ["river", "castle", "engine", "garden", "planet", "violin", "harbor", "forest"]


@pytest.fixture(scope="module")
def pd_cluster(request, tmp_path_factory):
    yield from pd_servers.shared(request, tmp_path_factory)


@pytest.fixture(scope="module")
def servers(pd_cluster):
    return {"prefill": pd_cluster.prefill, "decode": pd_cluster.decodes[0], "colo": pd_cluster.colo,
            "boot": pd_cluster.boot}


def assert_whole(url: str) -> None:
    with httpx.Client(base_url=url, timeout=T) as cl:
        assert_idle_and_whole(cl, timeout=IDLE_S)


def pd_post(servers, path: str, body: dict) -> tuple[httpx.Response, httpx.Response]:
    """What the PD router does: the same body with bootstrap fields to the prefill and the decode, at once."""
    b = {**body, "bootstrap_host": "127.0.0.1", "bootstrap_port": servers["boot"],
         "bootstrap_room": random.getrandbits(63)}
    with ThreadPoolExecutor(2) as ex:
        fp = ex.submit(httpx.post, servers["prefill"].url + path, json=b, timeout=T)
        fd = ex.submit(httpx.post, servers["decode"].url + path, json=b, timeout=T)
        return fp.result(), fd.result()


def bodies() -> list[dict]:
    """PARITY_N native bodies: plain greedy, logprobs (input + output, top-k), stop strings, regex and JSON schema."""
    out = []
    for i in range(PARITY_N):
        w = WORDS[i % len(WORDS)]
        sp = {"temperature": 0, "max_new_tokens": 6 + i % 5}
        body = {"text": f"Story {i}: the {w} near the old {WORDS[(i * 3) % len(WORDS)]} was", "sampling_params": sp}
        kind = i % 8
        if kind == 1:
            body.update(return_logprob=True, logprob_start_len=2, top_logprobs_num=3)
        elif kind == 2:
            sp["regex"] = r"(yes|no), [a-z]+"
        elif kind == 3:
            sp["json_schema"] = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'
            sp["max_new_tokens"] = 12
        elif kind == 4:
            sp["stop"] = [" the"]
        elif kind == 5:
            body["text"] = "A long shared preamble about rivers and mountains. " * 8 + body["text"]  # chunked
        out.append(body)
    return out


def _same(pd: dict, colo: dict) -> None:
    assert pd["text"] == colo["text"]
    a, b = pd["meta_info"], colo["meta_info"]
    for k in ("prompt_tokens", "completion_tokens", "finish_reason"):
        assert a[k] == b[k], k
    for k in ("output_token_logprobs", "input_token_logprobs"):
        assert (k in a) == (k in b), k
        if k in b:
            assert [e[1] for e in a[k]] == [e[1] for e in b[k]], k
            assert [e[0] for e in a[k]] == pytest.approx([e[0] for e in b[k]], abs=1e-3), k
    if "output_top_logprobs" in b:
        assert [[e[1] for e in row] for row in a["output_top_logprobs"]] == \
               [[e[1] for e in row] for row in b["output_top_logprobs"]]


def test_greedy_parity_with_colocated(servers):
    colo = servers["colo"].url

    def one(body):
        p, d = pd_post(servers, "/generate", body)
        c = httpx.post(colo + "/generate", json=body, timeout=T)
        return body, p, d, c

    with ThreadPoolExecutor(2) as ex:
        results = list(ex.map(one, bodies()))
    for body, p, d, c in results:
        assert c.status_code == 200, c.text
        assert p.status_code == 200 and d.status_code == 200, (p.text, d.text)
        _same(d.json(), c.json())
        # the prefill answers its first token only (the decode's first token is that one)
        pj = p.json()
        assert pj["meta_info"]["completion_tokens"] == 1
        assert c.json()["text"].startswith(pj["text"])
    for s in ("prefill", "decode"):
        assert_whole(servers[s].url)


def test_streaming_and_openai(servers):
    body = {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8},
            "stream": True, "bootstrap_host": "127.0.0.1", "bootstrap_port": servers["boot"],
            "bootstrap_room": random.getrandbits(63)}
    with ThreadPoolExecutor(1) as ex:
        fp = ex.submit(httpx.post, servers["prefill"].url + "/generate", json=body, timeout=T)
        with httpx.stream("POST", servers["decode"].url + "/generate", json=body, timeout=T) as r:
            lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        assert fp.result().status_code == 200
    assert lines[-1] == "data: [DONE]"
    colo = httpx.post(servers["colo"].url + "/generate", json={**body, "stream": False,
                                                                 "bootstrap_host": None, "bootstrap_port": None,
                                                                 "bootstrap_room": None}, timeout=T).json()
    assert json.loads(lines[-2][6:])["text"] == colo["text"]
    chat = {"model": "default", "messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 8,
            "temperature": 0, "logprobs": True, "top_logprobs": 2}
    comp = {"model": "default", "prompt": "1, 2, 3, 4,", "max_tokens": 8, "temperature": 0}
    for path, b in (("/v1/chat/completions", chat), ("/v1/completions", comp)):
        p, d = pd_post(servers, path, b)
        c = httpx.post(servers["colo"].url + path, json=b, timeout=T)
        assert p.status_code == d.status_code == c.status_code == 200, (p.text, d.text)
        dc, cc = d.json()["choices"][0], c.json()["choices"][0]
        assert dc.get("text", dc.get("message")) == cc.get("text", cc.get("message"))
        assert d.json()["usage"]["completion_tokens"] == c.json()["usage"]["completion_tokens"]
        if path == "/v1/chat/completions":
            assert [t["token"] for t in dc["logprobs"]["content"]] == [t["token"] for t in cc["logprobs"]["content"]]


def _pd_stats(url: str) -> dict:
    return httpx.get(url + "/server_info", timeout=T).json()["stats"]["disaggregation"]


def test_decode_radix_hit_sends_fewer_tokens(servers):
    prefix = "An entirely new shared introduction about lighthouses and sailors. " * 4
    # the set is shared (other files' requests are cached there): start from an empty decode cache
    assert_whole(servers["decode"].url)
    r = httpx.post(servers["decode"].url + "/flush_cache", timeout=T)
    assert r.status_code == 200, r.text
    sent, prompt_tokens = [], []
    for tail in ("First question: who", "Second question: why"):
        before = _pd_stats(servers["decode"].url)["transferred_tokens"]
        _, d = pd_post(servers, "/generate", {"text": prefix + tail,
                                              "sampling_params": {"temperature": 0, "max_new_tokens": 4}})
        assert d.status_code == 200, d.text
        sent.append(_pd_stats(servers["decode"].url)["transferred_tokens"] - before)
        prompt_tokens.append(d.json()["meta_info"]["prompt_tokens"])
    assert sent[0] == prompt_tokens[0], (sent, prompt_tokens)  # a new prefix: every position sent
    assert sent[1] < prompt_tokens[1] // 2, (sent, prompt_tokens)  # the shared prefix came from the decode's cache


def test_intake_refusals(servers):
    plain = {"text": "Hi", "sampling_params": {"max_new_tokens": 2}}
    r = httpx.post(servers["decode"].url + "/generate", json=plain, timeout=T)
    assert r.status_code == 400 and "bootstrap_host" in r.json()["error"]["message"]
    r = httpx.post(servers["colo"].url + "/generate", json={**plain, "bootstrap_room": 5}, timeout=T)
    assert r.status_code == 400 and "bootstrap_room" in r.json()["error"]["message"]
    pd = {"bootstrap_host": "127.0.0.1", "bootstrap_port": servers["boot"], "bootstrap_room": 1}
    r = httpx.post(servers["decode"].url + "/generate", json={**plain, **pd, "text": ["a", "b"]}, timeout=T)
    assert r.status_code == 400 and "batch input" in r.json()["error"]["message"]
    r = httpx.post(servers["prefill"].url + "/generate",
                   json={**plain, **pd, "sampling_params": {"n": 2, "temperature": 1}}, timeout=T)
    assert r.status_code == 400 and "n > 1" in r.json()["error"]["message"]
    r = httpx.post(servers["colo"].url + "/v1/completions",
                   json={"model": "default", "prompt": "x", "max_tokens": 2, **pd}, timeout=T)
    assert r.status_code == 400 and "bootstrap_host" in r.json()["error"]["message"]
    info = httpx.get(servers["prefill"].url + "/server_info", timeout=T).json()
    assert info["disaggregation_mode"] == "prefill" and info["disaggregation_bootstrap_port"] == servers["boot"]
    assert httpx.get(servers["decode"].url + "/server_info", timeout=T).json()["disaggregation_mode"] == "decode"
