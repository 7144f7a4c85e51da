"""cache_salt through the PD router (pd_servers.py's shared set: a prefill and a decode on a tiny float32
checkpoint): both servers get the salt with the body, so a prompt sent twice under one salt is a cache hit the
second time and under another salt (or none) is not; the greedy output is transformers' either way."""

from __future__ import annotations

import uuid

import httpx
import pytest

import pd_servers
from router_utils import RouterProcess, wait_for
from tiny_checkpoints import hf_greedy

pytestmark = pytest.mark.timeout(1800)
NEW = 4
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
T = 600.0


@pytest.fixture(scope="module")
def pd_cluster(request, tmp_path_factory):
    yield from pd_servers.shared(request, tmp_path_factory)


@pytest.fixture(scope="module")
def router(pd_cluster):
    r = RouterProcess("--pd-disaggregation", "--prefill", pd_cluster.prefill.url, "--decode",
                      pd_cluster.decodes[0].url, "--request-timeout-secs", str(T))
    try:
        wait_for(lambda: all(i["eligible"] for g in r.info()["groups"].values() for i in g["instances"]), T,
                 lambda: r.info())
        yield r
    finally:
        assert r.stop() == 0, r.tail()


def test_the_salt_reaches_both_sides(router, pd_cluster):
    seed = uuid.uuid4().int % 3000
    prompt = [(seed + 11 * i) % 3900 + 50 for i in range(40)]  # a prompt no other test sends
    a, b = uuid.uuid4().hex, uuid.uuid4().hex
    outs = []
    for salt in (a, a, b, None):
        body = {"input_ids": prompt, "sampling_params": SP, **({"cache_salt": salt} if salt else {})}
        r = httpx.post(router.url + "/generate", json=body, timeout=T)
        assert r.status_code == 200, r.text
        outs.append(r.json())
    cached = [o["meta_info"]["cached_tokens"] for o in outs]
    assert cached[0] == 0 and cached[1] > 0 and cached[2] == 0 and cached[3] == 0, cached
    want = hf_greedy(pd_cluster.model, prompt, NEW)
    assert [o["output_ids"] for o in outs] == [want] * len(outs)
