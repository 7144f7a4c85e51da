"""PD end to end: launch_router + one prefill + two decode servers (real processes) on a tiny float32
checkpoint. Greedy outputs through the router equal transformers' token for token (native, stream,
OpenAI); input logprobs come back; a decode killed mid-stream ends that stream with an error naming it,
the router keeps serving with the other decode, and the killed server leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_utils import ServerProcess, free_port
from router_utils import BOUND, HEALTH_FLAGS, RouterProcess, wait_for
from tiny_checkpoints import build_tiny, hf_greedy

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3, max_position_embeddings=4096)
NEW = 8
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
PROMPTS = [[(7 * i + 13 * k + 300) % 4000 + 10 for i in range(20 + 9 * k)] for k in range(4)]


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_llama_pd")
    model = build_tiny(d, "LlamaConfig", TINY, {})
    common = ("--model-path", str(d), "--dtype", "float32", "--max-total-tokens", "8192", "--frontend-port", "-1")
    boot = free_port()
    flags = [("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot)),
             ("--disaggregation-mode", "decode"), ("--disaggregation-mode", "decode")]
    with ThreadPoolExecutor(3) as ex:
        futures = [ex.submit(ServerProcess, *common, *f, new_session=True) for f in flags]
    started = [f.result() for f in futures if f.exception() is None]
    router = None
    try:
        if len(started) < 3:
            raise next(f.exception() for f in futures if f.exception() is not None)
        prefill, *decodes = started
        router = RouterProcess("--pd-disaggregation", "--prefill", prefill.url, "--decode", decodes[0].url,
                               "--decode", decodes[1].url, *HEALTH_FLAGS)
        yield router, prefill, decodes, model
    finally:
        if router is not None:
            assert router.stop() == 0, router.tail()
        for s in started:
            s.stop()


def test_greedy_equals_transformers_through_the_router(pd):
    router, _, _, model = pd
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as ex:  # at once: the decode side spreads them by load
        rs = list(ex.map(lambda p: httpx.post(router.url + "/generate", json={"input_ids": p, "sampling_params": SP},
                                              timeout=BOUND), PROMPTS))
    assert [r.status_code for r in rs] == [200] * len(PROMPTS), [r.text for r in rs]
    assert [r.json()["output_ids"] for r in rs] == want
    body = {"input_ids": PROMPTS[0], "sampling_params": SP, "stream": True}
    with httpx.stream("POST", router.url + "/generate", json=body, timeout=BOUND) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["output_ids"] == want[0]
    r = httpx.post(router.url + "/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": NEW, "temperature": 0,
                                                         "min_tokens": NEW}, timeout=BOUND)
    assert r.status_code == 200, r.text
    ref = httpx.post(router.url + "/generate", json={"input_ids": PROMPTS[1], "sampling_params": SP},
                     timeout=BOUND).json()
    assert r.json()["choices"][0]["text"] == ref["text"] and ref["output_ids"] == want[1]


def test_input_logprobs_come_back(pd):
    router = pd[0]
    body = {"input_ids": PROMPTS[2], "sampling_params": SP, "return_logprob": True, "logprob_start_len": 0}
    r = httpx.post(router.url + "/generate", json=body, timeout=BOUND)
    assert r.status_code == 200, r.text
    entries = r.json()["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == PROMPTS[2]  # entry i belongs to prompt token i
    assert entries[0][0] is None and all(isinstance(e[0], float) for e in entries[1:])


def test_decode_killed_mid_stream_fails_it_and_the_other_serves(pd):
    router, prefill, decodes, model = pd
    body = {"input_ids": PROMPTS[3], "stream": True,
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True, "temperature": 0}}
    with httpx.stream("POST", router.url + "/generate", json=body, timeout=BOUND) as r:
        lines = r.iter_lines()
        first = next(x for x in lines if x.startswith("data: "))
        assert "output_ids" in json.loads(first[6:])
        busy = [i["url"] for i in router.info()["groups"]["decode"]["instances"] if i["in_flight"]]
        assert len(busy) == 1
        victim = next(d for d in decodes if d.url == busy[0])
        pids = list(httpx.get(victim.url + "/server_info", timeout=BOUND).json()["pids"].values())
        os.killpg(victim.proc.pid, signal.SIGKILL)
        rest = [x[6:] for x in lines if x.startswith("data: ")]
    assert rest[-1] == "[DONE]"
    err = json.loads(rest[-2])["error"]
    assert victim.url in err["message"] and err["code"] in (502, 503, 504)
    victim.proc.wait(BOUND)

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            return True
    wait_for(lambda: all(gone(p) for p in pids), 15, lambda: f"processes of the killed decode left: {pids}")
    wait_for(lambda: not router.instance("decode", victim.url)["eligible"], 10, "killed decode still eligible")
    r = httpx.post(router.url + "/generate", json={"input_ids": PROMPTS[0], "sampling_params": SP}, timeout=BOUND)
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == hf_greedy(model, PROMPTS[0], NEW)
