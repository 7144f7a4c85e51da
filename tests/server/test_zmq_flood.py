"""A flood on the DSL's ZeroMQ port (server/frontend_socket.py) does not hold HTTP. One process, one thread
(benchmarks/bench_zmq_flood.py --flood), sends as fast as the link takes them random bytes, key-less pings and
model_info with a wrong key for FLOOD_S seconds (RADIXLANG_FLOOD_S, default 5; docs/DSL_LINK.md gives the 15 s
figure) against the test run's shared keyed server, while this process polls /health: every answer is 200 within a
generous bound (the check is "stays responsive", not a timing). The flood is counted (rate drops), and
afterwards DSL programs over the link (the client that was there, and a new one) give the greedy text of
before."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

import radixlang as sgl
from server_utils import KEYED_FLAGS, KEYED_KEY, shared_server

FLOOD_S = float(os.environ.get("RADIXLANG_FLOOD_S", "5"))
HEALTH_BOUND_S = 0.5
FLOODER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks",
                       "bench_zmq_flood.py")  # its --flood mode: the one flooder


@pytest.fixture(scope="module")
def server():
    return shared_server(*KEYED_FLAGS, frontend=True)


@sgl.function
def capital(s):
    s += "The capital of France is" + sgl.gen("a", max_tokens=8, temperature=0)


def _frontend(srv) -> dict:
    r = httpx.get(srv.url + "/server_info", headers={"Authorization": f"Bearer {KEYED_KEY}"}, timeout=30)
    return r.json()["frontend"]


def test_a_flood_on_the_zmq_port_leaves_health_responsive(server):
    link = sgl.RuntimeEndpoint(server.frontend, api_key=KEYED_KEY)
    before = capital.run(backend=link)["a"]
    dropped0 = _frontend(server)["dropped_by_reason"].get("rate", 0)
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    flood = subprocess.Popen([sys.executable, FLOODER, "--flood", server.frontend, str(FLOOD_S)],
                             stdout=subprocess.PIPE, text=True, env=env)
    latencies = []
    try:
        with httpx.Client(timeout=30) as http:
            time.sleep(0.5)  # the flood is under way
            while flood.poll() is None:
                t0 = time.perf_counter()
                r = http.get(server.url + "/health")
                latencies.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
                time.sleep(0.05)
        sent = int(flood.communicate(timeout=60)[0])
    finally:
        if flood.poll() is None:
            flood.kill()
    print(f"flood {FLOOD_S:g} s: {sent} messages; /health x{len(latencies)}: max {max(latencies) * 1e3:.1f} ms, "
          f"median {sorted(latencies)[len(latencies) // 2] * 1e3:.1f} ms")
    assert len(latencies) >= 5 and max(latencies) < HEALTH_BOUND_S
    info = _frontend(server)
    assert info["dropped_by_reason"].get("rate", 0) > dropped0 and info["problem"] is None
    assert capital.run(backend=link)["a"] == before
    assert capital.run(backend=sgl.RuntimeEndpoint(server.url, api_key=KEYED_KEY))["a"] == before
    link.shutdown()
