"""Server processes: API keys, SIGTERM leaves no child behind, a dead scheduler is reported, not hung on."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx

from server_utils import ServerProcess, wait_gone


def test_api_key_then_sigterm_stops_every_process():
    srv = ServerProcess("--api-key", "sekret", "--enable-metrics", "--max-total-tokens", "2048",
                        "--incremental-streaming-output")
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            assert c.post("/generate", json={"text": "hi"}).status_code == 401
            assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 401
            auth = {"Authorization": "Bearer sekret"}
            assert c.get("/metrics", headers=auth).status_code == 200  # behind the key (no --metrics-no-auth)
            out = c.post("/generate", headers=auth, json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
            assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 2
            body = {"text": "Once upon", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
            plain = c.post("/generate", headers=auth, json=body).json()
            with c.stream("POST", "/generate", headers=auth, json={**body, "stream": True}) as r:
                events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
            assert len(events) >= 2  # --incremental-streaming-output: deltas that add up
            assert "".join(e["text"] for e in events) == plain["text"]
            assert [t for e in events for t in e["output_ids"]] == plain["output_ids"]
            pids = c.get("/server_info", headers=auth).json()["pids"]
        assert set(pids) == {"server", "scheduler", "detokenizer"} and pids["server"] == srv.proc.pid
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(60)
        wait_gone(pids.values())
    finally:
        srv.stop()


def test_dead_scheduler_fails_requests_and_stops_the_server():
    srv = ServerProcess("--max-total-tokens", "2048")
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            pids = c.get("/server_info").json()["pids"]
            result: dict = {}

            def long_request() -> None:
                try:
                    result["r"] = c.post("/generate", json={"text": "Go on:", "sampling_params": {
                        "max_new_tokens": 1500, "ignore_eos": True}})
                except httpx.HTTPError as e:
                    result["r"] = e

            th = threading.Thread(target=long_request)
            th.start()
            deadline = time.time() + 60  # the request is in the scheduler (not a sleep: a loaded machine)
            while c.get("/server_info").json()["stats"]["num_running_reqs"] != 1:
                assert time.time() < deadline and th.is_alive(), result
                time.sleep(0.05)
            os.kill(pids["scheduler"], signal.SIGKILL)
            th.join(30)
            r = result["r"]
            assert isinstance(r, httpx.HTTPError) or r.status_code >= 500, r
            if not isinstance(r, httpx.HTTPError):
                assert "scheduler" in r.json()["error"]["message"]
        assert srv.proc.wait(30) == 1  # the server noticed and exited instead of hanging
        wait_gone(pids.values())
    finally:
        srv.stop()
