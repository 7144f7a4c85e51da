"""PD faults through real servers (pd_servers.py's shared set): a decode server killed while its prefill
computes (the prefill's request answers 503 naming the unreachable decode, the prefill serves on with another
decode), a prefill killed while its decode waits for the K/V (the decode's request answers 503 within the
heartbeat bound, its allocator is whole, a restarted prefill on the same bootstrap port serves the next
request). Every killed server's processes are gone afterwards; only what a test kills is started again (the
killed decode starts again while the prefill's forward stalls). The servers stall the forward pass of requests
"slow-*" (RADIXLANG_FAULT_INJECT, pd_servers.STALL_S) so that the kill lands mid-transfer; the transfer timeout
is far above the client's, so an answer proves the heartbeat detected the dead peer."""

from __future__ import annotations

import random
import time
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest

import pd_servers
from pd_servers import ServerProcess, kill, pids_of
from server_utils import assert_idle_and_whole

# The shared servers may start in this file's fixture: on a loaded 2-core machine that alone can take minutes.
pytestmark = pytest.mark.timeout(1800)
SEND_MARGIN_S = 2.0  # >> the link's POLL_S + a local TCP connect; << pd_servers.STALL_S
T = 300  # the client's bound: far below the servers' transfer timeout (600 s), far above a heartbeat (5 s)
BODY = {"text": "The lighthouse keeper walked up the stairs and", "sampling_params": {
    "temperature": 0, "max_new_tokens": 4, "min_new_tokens": 4}}  # exactly 4 (EOS may come early on the tiny model)


@pytest.fixture(scope="module")
def pd_cluster(request, tmp_path_factory):
    yield from pd_servers.shared(request, tmp_path_factory)


def post_pair(c: pd_servers.Cluster, prefill: ServerProcess, decode: ServerProcess, rid: str) -> tuple[Future, Future]:
    body = {**BODY, "rid": rid, "bootstrap_host": "127.0.0.1", "bootstrap_port": c.boot,
            "bootstrap_room": random.getrandbits(63)}
    ex = ThreadPoolExecutor(2)
    fp = ex.submit(httpx.post, prefill.url + "/generate", json=body, timeout=T)
    fd = ex.submit(httpx.post, decode.url + "/generate", json=body, timeout=T)
    ex.shutdown(wait=False)
    return fp, fd


def wait_receiving(srv: ServerProcess, bound: float = 120.0) -> None:
    """Until the decode has registered a room with the prefill (bounded)."""
    deadline = time.time() + bound
    while httpx.get(srv.url + "/server_info", timeout=T).json()["stats"]["disaggregation"]["receiving"] < 1:
        assert time.time() < deadline, "the decode never registered"
        time.sleep(0.1)


def assert_whole(srv: ServerProcess) -> None:
    with httpx.Client(base_url=srv.url, timeout=T) as cl:
        assert_idle_and_whole(cl, timeout=120)


def failed_transfers(srv: ServerProcess) -> int:
    return httpx.get(srv.url + "/server_info", timeout=T).json()["stats"]["disaggregation"]["transfers_failed"]


def test_killed_decode_fails_the_prefill_request(pd_cluster):
    cluster = pd_cluster
    cluster.ensure()  # two decodes (the other test leaves one; it restarts the prefill it kills)
    victim, other = cluster.live_decodes()
    pids = pids_of(victim)
    fp, fd = post_pair(cluster, cluster.prefill, victim, "slow-a")
    wait_receiving(victim)
    # The decode counts the room as receiving when it queues its registration; its link thread sends it within
    # POLL_S (20 ms), over a connection a freshly restarted decode may still be opening. Killed before it left,
    # the prefill would wait for a registration (the transfer timeout's bound), not a heartbeat, as CI once saw.
    # The prefill's stats cannot show the registration (its scheduler is inside the 12 s stalled forward), so
    # give the send a margin far above its latency and far below the stall.
    time.sleep(SEND_MARGIN_S)
    kill(victim, pids)
    # The killed decode starts again now, while the prefill's forward stalls (an idle CPU), instead of alone in
    # the next file's fixture; this test sends nothing to it.
    with ThreadPoolExecutor(1) as ex:
        restart = ex.submit(cluster.ensure)
        r = fp.result()
        assert r.status_code == 503, r.text
        msg = r.json()["error"]["message"]
        assert "decode server of room" in msg and "unreachable" in msg
        with pytest.raises(httpx.HTTPError):
            fd.result()
        # the prefill serves on with the other decode
        fp, fd = post_pair(cluster, cluster.prefill, other, "ok-a")
        assert fp.result().status_code == 200 and fd.result().status_code == 200, fd.result().text
        assert fd.result().json()["meta_info"]["completion_tokens"] == 4
        assert_whole(cluster.prefill)
        restart.result()


def test_killed_prefill_fails_the_decode_request_and_a_restart_serves(pd_cluster):
    cluster = pd_cluster
    decode = cluster.live_decodes()[0]
    failed_before = failed_transfers(decode)
    pids = pids_of(cluster.prefill)
    fp, fd = post_pair(cluster, cluster.prefill, decode, "slow-b")
    wait_receiving(decode)
    kill(cluster.prefill, pids)
    r = fd.result()
    assert r.status_code == 503, r.text
    assert "prefill server 127.0.0.1:" in r.json()["error"]["message"]
    assert "unreachable" in r.json()["error"]["message"]
    assert_whole(decode)  # the half-received request's slots are free
    assert failed_transfers(decode) == failed_before + 1
    with pytest.raises(httpx.HTTPError):
        fp.result()
    restarted = cluster.restart_prefill()  # the same bootstrap port; only the killed server starts again
    fp, fd = post_pair(cluster, restarted, decode, "ok-b")
    assert fp.result().status_code == 200 and fd.result().status_code == 200, fd.result().text
    assert fd.result().json()["meta_info"]["completion_tokens"] == 4
