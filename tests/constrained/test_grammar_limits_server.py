"""Grammar limits through the real server (xgrammar, the embedded model): the hostile grammars of an outside attack
(nested counted repetition, ambiguous recursion, a 16 KB literal, nested stars in a regex) each answer 400 naming
the construct while a concurrent canary keeps its latency and /health answers; a grammar that passes the pre-check
but is slow per token ends alone with finish_reason abort naming the budget flag; distinct grammars then
/flush_cache return the scheduler's RSS near where it was. After every scenario the pools are whole and a greedy
request gives the same text as before (docs/CONSTRAINED_LIMITS.md has the figures)."""

from __future__ import annotations

import concurrent.futures as cf
import statistics
import time

import httpx
import psutil
import pytest

from server_utils import ServerProcess
from test_grammar_cost import AMBIGUOUS, LONG_LITERAL, NESTED_COUNTED, NESTED_STARS
from server_utils import assert_idle_and_whole

CANARY = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 12, "temperature": 0}}
# passes the pre-check (the recursion is indirect) but every token costs the matcher more: the budget ends it
SLOW = 'root ::= s\ns ::= t | [a-z] | ""\nt ::= s s s | s s'
HOSTILE = [
    ({"ebnf": NESTED_COUNTED}, "can match nothing"),
    ({"ebnf": AMBIGUOUS}, "ambiguous recursion"),
    ({"ebnf": LONG_LITERAL}, "string literal of 16,000 bytes"),
    ({"regex": NESTED_STARS}, "a part that can match nothing"),
]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--dtype", "float32", "--max-total-tokens", "8192", "--debug-check-integrity",
                        "--grammar-backend", "xgrammar", "--grammar-step-timeout", "0.5",
                        "--grammar-request-timeout", "3")
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def baseline(client):
    """(greedy text, idle canary latency: median of 3). A grammar request first: the compile child is up, so the
    hostile cases measure their refusal, not the child's one-time start (the first grammar of a server)."""
    client.post("/generate", json=CANARY).raise_for_status()  # warm
    warm = {"text": "x", "sampling_params": {"max_new_tokens": 2, "temperature": 0, "ebnf": 'root ::= "ok"'}}
    client.post("/generate", json=warm).raise_for_status()
    times, texts = [], set()
    for _ in range(3):
        t0 = time.perf_counter()
        texts.add(client.post("/generate", json=CANARY).json()["text"])
        times.append(time.perf_counter() - t0)
    assert len(texts) == 1
    return texts.pop(), statistics.median(times)


def _canary_beside(client, baseline, request: dict) -> tuple[httpx.Response, float]:
    """Send `request` and, once it is in, a canary; -> (the request's response, the canary's latency)."""
    with cf.ThreadPoolExecutor(2) as pool:
        fut = pool.submit(client.post, "/generate", json=request)
        time.sleep(0.2)
        t0 = time.perf_counter()
        text = client.post("/generate", json=CANARY).json()["text"]
        canary = time.perf_counter() - t0
        assert client.get("/health", timeout=10).status_code == 200
        resp = fut.result(timeout=120)
    assert text == baseline[0]
    print(f"canary {canary:.3f} s beside {list(request['sampling_params'])[-1]} (idle {baseline[1]:.3f} s)")
    return resp, canary


def _whole_and_same(client, baseline) -> None:
    assert_idle_and_whole(client)
    assert client.post("/generate", json=CANARY).json()["text"] == baseline[0]


@pytest.mark.parametrize("sp,words", HOSTILE, ids=["nested_counted", "ambiguous", "long_literal", "nested_stars"])
def test_hostile_grammar_fails_alone_and_canary_keeps_its_latency(client, baseline, sp, words):
    req = {"text": "x", "sampling_params": {"max_new_tokens": 16, "temperature": 0, **sp}}
    resp, canary = _canary_beside(client, baseline, req)
    assert resp.status_code == 400, resp.text
    msg = resp.json()["error"]["message"]
    assert "grammar too expensive" in msg and words in msg and "limit" in msg, msg
    assert canary < 4 * baseline[1] + 2.0  # generous (a shared CPU): the refusal took no core from the forward
    _whole_and_same(client, baseline)


def test_slow_grammar_ends_alone_naming_the_budget(client, baseline):
    req = {"text": "Write letters: abc", "sampling_params": {"max_new_tokens": 400, "temperature": 0,
                                                             "ignore_eos": True, "ebnf": SLOW}}
    resp, canary = _canary_beside(client, baseline, req)
    assert resp.status_code == 200, resp.text
    finish = resp.json()["meta_info"]["finish_reason"]
    assert finish["type"] == "abort" and "--grammar-" in finish["message"], finish
    print(f"slow grammar: {finish['message']} after {resp.json()['meta_info']['completion_tokens']} tokens")
    assert resp.json()["meta_info"]["completion_tokens"] < 400
    _whole_and_same(client, baseline)


def _scheduler_rss(client) -> int:
    pid = client.get("/server_info").json()["pids"]["scheduler"]
    return psutil.Process(pid).memory_info().rss


def _distinct(client, start: int, n: int) -> None:
    for i in range(start, start + n):
        r = client.post("/generate", json={"text": "Say something:", "sampling_params": {
            "max_new_tokens": 6, "temperature": 0, "ebnf": f'root ::= "k{i} " [a-z ]{{0,40}} "."'}})
        assert r.status_code == 200, r.text


def test_distinct_grammars_then_flush_return_the_memory(client, baseline):
    _distinct(client, 0, 5)  # the backend's one-time structures (tokenizer info, thread pools)
    assert client.post("/flush_cache").status_code == 200
    before = _scheduler_rss(client)
    _distinct(client, 100, 12)
    grown = _scheduler_rss(client)
    assert client.post("/flush_cache").status_code == 200
    after = _scheduler_rss(client)
    print(f"scheduler RSS MiB: before {before / 2**20:.0f}, 12 grammars {grown / 2**20:.0f}, "
          f"flushed {after / 2**20:.0f}")
    assert after < before * 1.10, (before, grown, after)
    _whole_and_same(client, baseline)
