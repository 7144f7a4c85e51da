"""PD end to end: launch_router + one prefill + two decode servers (real processes, pd_servers.py's shared
set) on a tiny float32 checkpoint. Greedy outputs through the router equal transformers' token for token
(native, stream, OpenAI); input logprobs come back; a decode killed mid-stream ends that stream with an
error naming it, the router keeps serving with the other decode, and the killed server leaves no process
behind (the next file to use the set gets it restarted)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import pd_servers
from router_utils import RouterProcess, wait_for
from tiny_checkpoints import hf_greedy

# The shared servers may start in this file's fixture: on a loaded 2-core machine that alone can take minutes.
pytestmark = pytest.mark.timeout(1800)
NEW = 8
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
PROMPTS = [[(7 * i + 13 * k + 300) % 4000 + 10 for i in range(20 + 9 * k)] for k in range(4)]
T = 600.0  # the client's bound on a request that goes through: a loaded machine
# real servers on a loaded machine: a slow /health is not a dead one (a killed server refuses at once), and the
# router's bound on a routed call is the client's
ROUTER_FLAGS = ["--health-check-interval-secs", "0.2", "--health-check-timeout-secs", "60",
                "--health-failure-threshold", "2", "--request-timeout-secs", str(T)]


@pytest.fixture(scope="module")
def pd_cluster(request, tmp_path_factory):
    yield from pd_servers.shared(request, tmp_path_factory)


@pytest.fixture(scope="module")
def pd(pd_cluster):
    prefill, decodes = pd_cluster.prefill, list(pd_cluster.decodes)
    router = RouterProcess("--pd-disaggregation", "--prefill", prefill.url, "--decode", decodes[0].url,
                           "--decode", decodes[1].url, *ROUTER_FLAGS)
    try:
        wait_for(lambda: all(i["eligible"] for g in router.info()["groups"].values() for i in g["instances"]), T,
                 lambda: router.info())
        yield router, prefill, decodes, pd_cluster.model
    finally:
        assert router.stop() == 0, router.tail()


def test_greedy_equals_transformers_through_the_router(pd):
    router, _, _, model = pd
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as ex:  # at once: the decode side spreads them by load
        rs = list(ex.map(lambda p: httpx.post(router.url + "/generate", json={"input_ids": p, "sampling_params": SP},
                                              timeout=T), PROMPTS))
    assert [r.status_code for r in rs] == [200] * len(PROMPTS), [r.text for r in rs]
    assert [r.json()["output_ids"] for r in rs] == want
    body = {"input_ids": PROMPTS[0], "sampling_params": SP, "stream": True}
    with httpx.stream("POST", router.url + "/generate", json=body, timeout=T) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["output_ids"] == want[0]
    r = httpx.post(router.url + "/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": NEW, "temperature": 0,
                                                         "min_tokens": NEW}, timeout=T)
    assert r.status_code == 200, r.text
    ref = httpx.post(router.url + "/generate", json={"input_ids": PROMPTS[1], "sampling_params": SP},
                     timeout=T).json()
    assert r.json()["choices"][0]["text"] == ref["text"] and ref["output_ids"] == want[1]


def test_input_logprobs_come_back(pd):
    router = pd[0]
    body = {"input_ids": PROMPTS[2], "sampling_params": SP, "return_logprob": True, "logprob_start_len": 0}
    r = httpx.post(router.url + "/generate", json=body, timeout=T)
    assert r.status_code == 200, r.text
    entries = r.json()["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == PROMPTS[2]  # entry i belongs to prompt token i
    assert entries[0][0] is None and all(isinstance(e[0], float) for e in entries[1:])
    # vLLM's prompt_logprobs: the prompt tokens' ranks travel with their logprobs (PDDone)
    c = httpx.post(router.url + "/v1/completions", json={"prompt": PROMPTS[2], "max_tokens": 1, "prompt_logprobs": 0},
                   timeout=T)
    assert c.status_code == 200, c.text
    plp = c.json()["choices"][0]["prompt_logprobs"]
    assert plp[0] is None and [list(d) for d in plp[1:]] == [[str(t)] for t in PROMPTS[2][1:]]
    assert [d[str(t)]["logprob"] for d, t in zip(plp[1:], PROMPTS[2][1:])] == [e[0] for e in entries[1:]]
    assert all(type(d[str(t)]["rank"]) is int and d[str(t)]["rank"] >= 1 for d, t in zip(plp[1:], PROMPTS[2][1:]))


def test_decode_killed_mid_stream_fails_it_and_the_other_serves(pd):
    router, prefill, decodes, model = pd
    # the earlier requests' relays end after their last byte went out: wait for both decodes to be unloaded
    wait_for(lambda: not any(i["in_flight"] for i in router.info()["groups"]["decode"]["instances"]), T,
             lambda: router.info())
    body = {"input_ids": PROMPTS[3], "stream": True,
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True, "temperature": 0}}
    with httpx.stream("POST", router.url + "/generate", json=body, timeout=T) as r:
        lines = r.iter_lines()
        first = next(x for x in lines if x.startswith("data: "))
        assert "output_ids" in json.loads(first[6:])
        busy = [i["url"] for i in router.info()["groups"]["decode"]["instances"] if i["in_flight"]]
        assert len(busy) == 1
        victim = next(d for d in decodes if d.url == busy[0])
        pd_servers.kill(victim, pd_servers.pids_of(victim))  # every process of it gone, bounded
        rest = [x[6:] for x in lines if x.startswith("data: ")]
    assert rest[-1] == "[DONE]"
    err = json.loads(rest[-2])["error"]
    assert victim.url in err["message"] and err["code"] in (502, 503, 504)
    wait_for(lambda: not router.instance("decode", victim.url)["eligible"], 120, "killed decode still eligible")
    r = httpx.post(router.url + "/generate", json={"input_ids": PROMPTS[0], "sampling_params": SP}, timeout=T)
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == hf_greedy(model, PROMPTS[0], NEW)
