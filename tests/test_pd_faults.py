"""PD faults through real servers: a decode server killed while its prefill computes (the prefill's request
answers 503 naming the unreachable decode, the prefill serves on with another decode), a prefill killed while
its decode waits for the K/V (the decode's request answers 503 within the heartbeat bound, its allocator is
whole, a restarted prefill on the same bootstrap port serves the next request). Every killed server's
processes are gone afterwards. The prefill stalls its forward pass for requests "slow-*" (RADIXLANG_FAULT_INJECT)
so that the kill lands mid-transfer; the decode's transfer timeout is far above the client's, so an answer
proves the heartbeat detected the dead peer."""

from __future__ import annotations

import os
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from radixlang_runtime.faults import ENV
from server_utils import ServerProcess, free_port
from test_server import assert_idle_and_whole

# Three servers start side by side in the module's fixture: on a loaded 2-core machine that alone can take minutes.
pytestmark = pytest.mark.timeout(1800)
START_S = 900.0

COMMON = ("--dtype", "float32", "--max-total-tokens", "4096", "--debug-check-integrity", "--frontend-port", "-1",
          "--disaggregation-transfer-timeout", "600", "--disaggregation-heartbeat-timeout", "3")
BODY = {"text": "The lighthouse keeper walked up the stairs and", "sampling_params": {"temperature": 0,
                                                                                       "max_new_tokens": 4}}


def start_prefill(boot: int, stall: bool) -> ServerProcess:
    if stall:
        os.environ[ENV] = "forward:slow:stall=8"
    try:
        return ServerProcess(*COMMON, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot),
                             new_session=True, timeout=START_S)
    finally:
        os.environ.pop(ENV, None)


@pytest.fixture(scope="module")
def cluster():
    boot = free_port()
    with ThreadPoolExecutor(3) as ex:
        futures = [ex.submit(start_prefill, boot, True)] + \
                  [ex.submit(ServerProcess, *COMMON, "--disaggregation-mode", "decode", new_session=True,
                             timeout=START_S) for _ in range(2)]
    up = [f.result() for f in futures if f.exception() is None]
    c = {"boot": boot, "servers": up}
    try:
        if len(up) < 3:
            raise next(f.exception() for f in futures if f.exception() is not None)
        c.update(prefill=up[0], decode=up[1], decode2=up[2])
        yield c
    finally:
        for s in c["servers"]:
            s.stop()


def post_pair(c: dict, prefill: ServerProcess, decode: ServerProcess, rid: str) -> tuple:
    body = {**BODY, "rid": rid, "bootstrap_host": "127.0.0.1", "bootstrap_port": c["boot"],
            "bootstrap_room": random.getrandbits(63)}
    ex = ThreadPoolExecutor(2)
    fp = ex.submit(httpx.post, prefill.url + "/generate", json=body, timeout=300)
    fd = ex.submit(httpx.post, decode.url + "/generate", json=body, timeout=300)
    ex.shutdown(wait=False)
    return fp, fd


def wait_receiving(srv: ServerProcess) -> None:
    """Until the decode has registered a room with the prefill (bounded)."""
    deadline = time.time() + 30
    while httpx.get(srv.url + "/server_info", timeout=10).json()["stats"]["disaggregation"]["receiving"] < 1:
        assert time.time() < deadline, "the decode never registered"
        time.sleep(0.1)


def pids_of(srv: ServerProcess) -> list[int]:
    """Every process of the server (ask before stalling it: /server_info waits for its scheduler)."""
    return list(httpx.get(srv.url + "/server_info", timeout=60).json()["pids"].values())


def kill(srv: ServerProcess, pids: list[int]) -> None:
    """SIGKILL the server's process group; every process of it must be gone (no orphans)."""
    os.killpg(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(30)
    deadline = time.time() + 30
    for pid in pids:
        while _alive(pid):
            assert time.time() < deadline, f"process {pid} of the killed server is still running"
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_killed_decode_fails_the_prefill_request(cluster):
    pids = pids_of(cluster["decode"])
    fp, fd = post_pair(cluster, cluster["prefill"], cluster["decode"], "slow-a")
    wait_receiving(cluster["decode"])
    kill(cluster["decode"], pids)
    r = fp.result()
    assert r.status_code == 503, r.text
    assert "decode server of room" in r.json()["error"]["message"] and "unreachable" in r.json()["error"]["message"]
    with pytest.raises(httpx.HTTPError):
        fd.result()
    # the prefill serves on with the other decode
    fp, fd = post_pair(cluster, cluster["prefill"], cluster["decode2"], "ok-a")
    assert fp.result().status_code == 200 and fd.result().status_code == 200, fd.result().text
    assert fd.result().json()["meta_info"]["completion_tokens"] == 4
    with httpx.Client(base_url=cluster["prefill"].url) as cl:
        assert_idle_and_whole(cl)


def test_killed_prefill_fails_the_decode_request_and_a_restart_serves(cluster):
    pids = pids_of(cluster["prefill"])
    fp, fd = post_pair(cluster, cluster["prefill"], cluster["decode2"], "slow-b")
    wait_receiving(cluster["decode2"])
    kill(cluster["prefill"], pids)
    r = fd.result()
    assert r.status_code == 503, r.text
    assert "prefill server 127.0.0.1:" in r.json()["error"]["message"]
    assert "unreachable" in r.json()["error"]["message"]
    with httpx.Client(base_url=cluster["decode2"].url) as cl:
        assert_idle_and_whole(cl)  # the half-received request's slots are free
        assert cl.get("/server_info").json()["stats"]["disaggregation"]["transfers_failed"] >= 1
    restarted = start_prefill(cluster["boot"], False)
    cluster["servers"].append(restarted)
    fp, fd = post_pair(cluster, restarted, cluster["decode2"], "ok-b")
    assert fp.result().status_code == 200 and fd.result().status_code == 200, fd.result().text
    assert fd.result().json()["meta_info"]["completion_tokens"] == 4
