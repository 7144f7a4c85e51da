"""The overlap schedule's flag on a real server (the embedded SmolLM2, float32): --enable-overlap-schedule is in
/server_info with the scheduler's overlap counters, the start log names it, and concurrent /generate requests
are answered with the same tokens as one at a time."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from server_utils import ServerProcess

FLAGS = ("--dtype", "float32", "--max-total-tokens", "2048", "--enable-overlap-schedule")


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(*FLAGS)
    yield srv
    srv.stop()


def generate(url: str, text: str, n: int) -> list[int]:
    body = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}}
    r = httpx.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def test_enable_overlap_schedule_is_honoured(server):
    prompts = [("The capital of France is", 12), ("def fibonacci(n):", 20), ("Once upon a time", 6)]
    alone = [generate(server.url, t, n) for t, n in prompts]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        together = list(pool.map(lambda p: generate(server.url, *p), prompts))
    assert together == alone
    info = httpx.get(server.url + "/server_info", timeout=30).json()
    assert info["enable_overlap_schedule"] is True and info["disable_overlap_schedule"] is False
    counters = info["stats"]["overlap_schedule"]
    assert counters is not None and counters["overlapped_steps"] > 0
    assert "overlap schedule: on" in server.tail(200_000)
