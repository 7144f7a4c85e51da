"""A slow grammar beside a canary, through the real server (xgrammar, the embedded model): the canary's latency
while a request with a grammar that passes the pre-check but costs more every token is in its slow phase, against
the canary's idle latency; the slow request ends alone with finish_reason abort naming its budget flag. Its
masks compute on the step guard's thread while the batch runs without it (scheduler/mask_gate.py), so the
canary keeps its pace (figures: docs/CONSTRAINED_LIMITS.md). The pools are whole and the greedy canary text the
same after."""

from __future__ import annotations

import json
import statistics
import threading
import time

import httpx
import pytest
from server_utils import ServerProcess
from server_utils import assert_idle_and_whole

CANARY = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
# passes the pre-check (the recursion is indirect); each mask costs more the longer the output: tens of ms
# after about 20 letters, hundreds after 60 (xgrammar's Earley parser keeps every parse)
SLOW = ('root ::= s\ns ::= t | [a-z] | ""\n'
        't ::= s s s s s s | s s s s s | s s s s | s s s | s s')
SLOW_PHASE_TOKENS = 20
# --grammar-request-timeout: 6 s of grammar time reach past token 80 (the first 20 tokens' masks cost well under a
# second), room for the canaries beside it; docs/CONSTRAINED_LIMITS.md's figures were taken with 12 s


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--dtype", "float32", "--max-total-tokens", "8192", "--debug-check-integrity",
                        "--grammar-backend", "xgrammar", "--grammar-step-timeout", "5",
                        "--grammar-request-timeout", "6")
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


def _canary(client) -> tuple[str, float]:
    t0 = time.perf_counter()
    r = client.post("/generate", json=CANARY)
    r.raise_for_status()
    return r.json()["text"], time.perf_counter() - t0


class _SlowStream(threading.Thread):
    """The slow request, streamed: `tokens` counts its progress; `final` is its last record."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.tokens, self.final, self.error = url, 0, None, None

    def run(self) -> None:
        body = {"text": "Write letters: abc", "stream": True,
                "sampling_params": {"max_new_tokens": 2000, "temperature": 0, "ignore_eos": True, "ebnf": SLOW}}
        try:
            with httpx.stream("POST", self.url + "/generate", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    if line.startswith("data:") and line[5:].strip() != "[DONE]":
                        self.final = json.loads(line[5:])
                        self.tokens = self.final["meta_info"]["completion_tokens"]
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e


def test_canary_keeps_its_latency_beside_a_slow_grammar(server):
    with httpx.Client(base_url=server.url, timeout=300) as client:
        _canary(client)  # warm
        idle = [_canary(client) for _ in range(3)]
        text = idle[0][0]
        assert all(t == text for t, _ in idle)
        slow = _SlowStream(server.url)
        slow.start()
        t0 = time.monotonic()
        while slow.tokens < SLOW_PHASE_TOKENS and slow.is_alive():
            assert time.monotonic() - t0 < 240, "the slow request never reached its slow phase"
            time.sleep(0.05)
        assert slow.is_alive() and slow.final["meta_info"]["finish_reason"] is None, slow.final
        beside = []
        for _ in range(3):
            beside.append(_canary(client))
            if not slow.is_alive():
                break
        in_flight = slow.is_alive()
        slow.join(240)
        assert not slow.is_alive() and slow.error is None, slow.error
        finish = slow.final["meta_info"]["finish_reason"]
        assert finish["type"] == "abort" and "--grammar-" in finish["message"], finish
        idle_s = statistics.median(s for _, s in idle)
        beside_s = statistics.median(s for _, s in beside)
        print(f"canary idle {[round(s, 3) for _, s in idle]} median {idle_s:.3f} s; beside the slow grammar "
              f"(from token {SLOW_PHASE_TOKENS}, {'still' if in_flight else 'no longer'} running after) "
              f"{[round(s, 3) for _, s in beside]} median {beside_s:.3f} s; ratio {beside_s / idle_s:.2f}; "
              f"slow request: {slow.tokens} tokens, {finish['message']}")
        assert all(t == text for t, _ in beside)
        assert beside_s < 5 * idle_s + 5.0  # generous (a shared CPU): the slow grammar never held the batch
        assert_idle_and_whole(client)
        assert _canary(client)[0] == text
