"""The DSL against a real server started by `sgl.Runtime(...)` (launch_server with --api-key; its ZeroMQ
link on by default), over both links: ZeroMQ (`Runtime.endpoint`) and HTTP (`RuntimeEndpoint(url, link="http")`).
The module ends by killing the scheduler mid-stream, then checks shutdown leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import radixlang as sgl
from radixlang import test_programs as tp
from radixlang.errors import BackendError, ProgramError

pytestmark = pytest.mark.slow
KEY = "dsl-test-key"


@pytest.fixture(scope="module")
def runtime():
    rt = sgl.Runtime(dtype="float32", max_total_tokens=8192, api_key=KEY, launch_timeout=300)
    rt.child_pids = list(sgl.get_server_info(rt)["pids"].values())
    yield rt
    rt.shutdown()


@pytest.fixture(scope="module")
def links(runtime):
    http = sgl.RuntimeEndpoint(runtime.url, api_key=KEY, link="http")  # "auto" would find the ZeroMQ link
    assert runtime.endpoint.transport == "zmq" and http.transport == "http"
    return {"zmq": runtime, "http": http}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped) is gone too
        return f.read().split(")")[-1].split()[0] != "Z"


# every program over ZeroMQ; over HTTP one of each kind of call (a fork, a select, constrained gens, a
# stream): the request bodies are the same NativeBackend code on both links, and
# test_both_links_agree_and_report compares them
HTTP = ("test_few_shot_qa", "test_select", "test_decode_json", "test_regex", "test_stream_logprobs",
        "test_parallel_encoding")
CASES = [(p, "zmq") for p in tp.ALL] + [(p, "http") for p in tp.ALL if p.__name__ in HTTP]


@pytest.mark.parametrize("program,link", CASES, ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_program_on_server(links, link, program):
    sgl.set_default_backend(links[link])
    try:
        program()
    finally:
        sgl.set_default_backend(None)


def test_both_links_agree_and_report(links, runtime):
    info = sgl.get_server_info(links["zmq"])
    assert info["frontend_port"] == int(runtime.frontend_url.rsplit(":", 1)[1])
    assert info["api_key"] is not None and KEY not in json.dumps(info)  # set, and never shown
    assert links["http"].get_chat_template().name == links["zmq"].get_chat_template().name == "chatml"
    picks = [tp.true_or_false.run(statement="Fire is cold.", backend=links[k]) for k in ("zmq", "http")]
    assert picks[0]["answer"] == picks[1]["answer"]
    assert picks[0].get_meta_info("answer")["normalized_prompt_logprobs"] == pytest.approx(
        picks[1].get_meta_info("answer")["normalized_prompt_logprobs"], abs=1e-5)


def test_the_api_key_rule_holds_on_both_links(runtime):
    with pytest.raises(BackendError, match="401"):
        sgl.RuntimeEndpoint(runtime.frontend_url, api_key="wrong")
    with pytest.raises(BackendError, match="401"):
        sgl.RuntimeEndpoint(runtime.url)


@pytest.mark.parametrize("link", ["zmq", "http"])
def test_run_batch_prefix_is_cached_once(links, link, monkeypatch):
    assert links[link].flush_cache() is True
    backend = getattr(links[link], "endpoint", None) or links[link]
    unpin, seen = backend.unpin_prefix, []

    def spy(handle):  # the batch's end: its pin is still there, then released
        seen.append((handle, sgl.get_server_info(links[link])["stats"]))
        unpin(handle)

    monkeypatch.setattr(backend, "unpin_prefix", spy)
    states = tp.few_shot_qa.run_batch([{"question": f"What is the capital of country {i}?"} for i in range(4)],
                                      backend=links[link], temperature=0)
    cached = [st.get_meta_info("answer")["cached_tokens"] for st in states]
    prompt = [st.get_meta_info("answer")["prompt_tokens"] for st in states]
    assert all(c >= p - 24 for c, p in zip(cached, prompt)), (cached, prompt)  # the shared prefix came from the cache
    assert len(seen) == 1 and seen[0][0] and seen[0][1]["num_pins"] == 1 and seen[0][1]["pinned_slots"] > 0, seen
    assert sgl.get_server_info(links[link])["stats"]["num_pins"] == 0


def _batch_prefill(link, batch: list, num_threads: int) -> int:
    """Prefill tokens the server computed for one run_batch of few_shot_qa over `link` (cache flushed first)."""
    assert link.flush_cache() is True
    before = sgl.get_server_info(link)["stats"]["prefill_tokens_computed"]
    states = tp.few_shot_qa.run_batch(batch, backend=link, temperature=0, num_threads=num_threads)
    assert all(st.error() is None for st in states)
    return sgl.get_server_info(link)["stats"]["prefill_tokens_computed"] - before


def test_a_batch_computes_no_more_prefill_than_one_program_at_a_time(links):
    """Questions that share more than a KV page past the traced prefix: the programs that arrive together
    (ZeroMQ sends them in one burst) compute the shared pages once, as programs run one at a time do, and
    HTTP computes the same (the burst once computed every shared page once per program)."""
    long_qs = ["Which river flows through the capital city of France, and what is the river called there?",
               "Which mountain range lies along the northern border of India, and what is its highest peak?"]
    batch = [{"question": q + " " * k} for k in range(3) for q in long_qs]
    one_at_a_time = _batch_prefill(links["zmq"], batch, 1)
    assert _batch_prefill(links["zmq"], batch, len(batch)) == one_at_a_time
    assert _batch_prefill(links["http"], batch, len(batch)) == one_at_a_time


def test_a_killed_scheduler_ends_streaming_states_within_seconds(links, monkeypatch):
    # a state that missed the failure would wait out this bound and raise TimeoutError, not ProgramError
    monkeypatch.setattr(sgl.global_config, "wait_timeout", 60.0)

    @sgl.function
    def long(s):
        s += "Count slowly:" + sgl.gen("a", max_tokens=4000, ignore_eos=True, temperature=0)

    pids = sgl.get_server_info(links["zmq"])["pids"]
    states = [long.run(backend=links[k], stream=True) for k in ("zmq", "http")]
    for st in states:
        next(iter(st.text_iter("a")))  # generation is under way
    os.kill(pids["scheduler"], signal.SIGKILL)
    for st in states:
        with pytest.raises(ProgramError):
            st["a"]
        assert isinstance(st.error(), BackendError)


def test_shutdown_leaves_no_process(runtime):
    pids = [runtime.pid, *runtime.child_pids]
    runtime.shutdown()
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids)
    out = os.popen(f"ps -o pid= --ppid {pids[0]}").read().split()
    assert out == [], f"children of the server still running: {out}"
