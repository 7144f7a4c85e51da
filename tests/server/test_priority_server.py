"""Priority scheduling on a real server (--enable-priority-scheduling, one running request at a time, float32):
a long low-priority request streams; a request within the preemption threshold of it waits, one past it retracts
it; the finish order follows the priorities, the retracted request's greedy text is the one it has alone, the
counters say so and the allocator is whole. With the waiting queue at --max-queued-requests, a new request answers
503 unless it outranks a waiting one, which it then drops (503 to that one). `priority` on native and OpenAI
bodies, and a 400 naming it where the server runs without priority scheduling."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from server_utils import FP32_FLAGS, ServerProcess, assert_idle_and_whole, shared_server, stats


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--dtype", "float32", "--max-total-tokens", "4096", "--max-running-requests", "1",
                        "--enable-priority-scheduling", "--max-queued-requests", "2", "--debug-check-integrity")
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


def body(text: str, n: int, priority: int, **kw) -> dict:
    return {"text": text, "priority": priority, **kw,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}


def test_a_higher_priority_request_retracts_the_running_one(server):
    done: list[tuple[str, dict]] = []
    lock = threading.Lock()

    def post(name: str, b: dict) -> None:
        r = httpx.post(server.url + "/generate", json=b, timeout=120)
        assert r.status_code == 200, r.text
        with lock:
            done.append((name, r.json()))

    low = body("Once upon a time", 100, 0)
    with httpx.Client(base_url=server.url, timeout=120) as c:
        alone = c.post("/generate", json=low).json()
        before = stats(c)["num_priority_preemptions"]
        with c.stream("POST", "/generate", json={**low, "stream": True}) as s:
            lines = s.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[6:])["meta_info"]["finish_reason"] is None  # low is decoding
            near = threading.Thread(target=post, args=("near", body("The river", 8, 10)))
            near.start()
            deadline = time.time() + 30
            while stats(c)["num_waiting_reqs"] < 1:  # near waits: 10 above is not past the threshold (10)
                assert time.time() < deadline
                time.sleep(0.02)
            high = threading.Thread(target=post, args=("high", body("The mountain", 8, 11)))
            high.start()
            final = None
            for line in lines:
                if line.startswith("data: ") and line != "data: [DONE]":
                    final = json.loads(line[6:])
            with lock:
                done.append(("low", final))
        near.join(60)
        high.join(60)
        assert [name for name, _ in done] == ["high", "near", "low"]
        out = dict(done)
        assert out["low"]["meta_info"]["num_retractions"] == 1
        assert out["low"]["text"] == alone["text"] and out["low"]["meta_info"]["completion_tokens"] == 100
        assert out["near"]["meta_info"]["num_retractions"] == out["high"]["meta_info"]["num_retractions"] == 0
        assert stats(c)["num_priority_preemptions"] == before + 1
        assert_idle_and_whole(c)


def test_a_full_queue_answers_503_or_drops_the_lowest_for_a_higher_one(server):
    results: dict[str, httpx.Response] = {}

    def post(name: str, b: dict) -> None:
        results[name] = httpx.post(server.url + "/generate", json=b, timeout=120)

    def waiting(c, n: int) -> None:
        deadline = time.time() + 30
        while stats(c)["num_waiting_reqs"] < n:
            assert time.time() < deadline
            time.sleep(0.02)

    with httpx.Client(base_url=server.url, timeout=120) as c:
        with c.stream("POST", "/generate", json={**body("Once upon a time", 120, 0), "stream": True}) as s:
            lines = s.iter_lines()  # kept: a dropped iterator closes the stream, which aborts the request
            next(line for line in lines if line.startswith("data: "))  # it runs: the one slot is taken
            threads = []
            for k, (name, p) in enumerate((("a", 5), ("b", 5))):  # 5 is within the threshold of 0: they wait
                threads.append(threading.Thread(target=post, args=(name, body(f"Text {name}", 4, p))))
                threads[-1].start()
                waiting(c, k + 1)
            full = c.post("/generate", json=body("Text c", 4, 5))  # the queue holds 2: refused
            assert full.status_code == 503 and "--max-queued-requests 2" in full.json()["error"]["message"]
            chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 2, "priority": 5})
            assert chat.status_code == 503 and chat.json()["error"]["code"] == 503
            threads.append(threading.Thread(target=post, args=("d", body("Text d", 4, 9))))  # drops b (newest)
            threads[-1].start()
            for t in threads:
                t.join(120)
            for _ in lines:
                pass
        assert results["a"].status_code == results["d"].status_code == 200
        assert results["b"].status_code == 503 and "higher priority" in results["b"].json()["error"]["message"]
        assert_idle_and_whole(c)


def test_priority_on_the_openai_routes_and_its_checks(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                 "priority": -3})
        assert r.status_code == 200, r.text
        r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "priority": 7})
        assert r.status_code == 200, r.text
        for bad in ("high", 1.5, True, 2**40):
            r = c.post("/generate", json=body("hi", 2, bad))
            assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text
        assert_idle_and_whole(c)


def test_a_server_without_priority_scheduling_refuses_the_field():
    srv = shared_server(*FP32_FLAGS)  # requests only: one server for these flags, shared by the modules that use them
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        for route, b in (("/generate", body("hi", 2, 1)),
                         ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "priority": 1}),
                         ("/v1/completions", {"prompt": "hi", "priority": 1})):
            r = c.post(route, json=b)
            assert r.status_code == 400 and "--enable-priority-scheduling" in r.json()["error"]["message"], r.text
            assert r.json()["error"]["param"] == "priority"
        assert c.post("/generate", json={**body("hi", 2, 0), "priority": None}).status_code == 200
