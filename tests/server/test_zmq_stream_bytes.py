"""The DSL's ZeroMQ link streams deltas: the bytes of a stream grow linearly with its tokens.

One real server on a tiny random Llama checkpoint (a few thousand decode steps take seconds). A raw
DEALER socket, the DSL client's own wire format (FrontendReq / FrontendOut), streams 500 and 1,000
tokens (ignore_eos, greedy) and counts the bytes that arrive: twice the tokens must cost about twice the
bytes (under 2.5x; the old scheme, the whole text so far in every event, costs about 4x). The deltas put
together equal the plain reply's text and ids, and a DSL program streaming over the link
(ZmqBackend) yields that same text."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import zmq

import radixlang as sgl
from radixlang_runtime.protocol import messages as m
from server_utils import ServerProcess
from tiny_checkpoints import build_tiny

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # thousands of decode steps: slow on a loaded machine
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3, max_position_embeddings=4096)
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    build_tiny(path, "LlamaConfig", TINY, {})
    srv = ServerProcess("--model-path", str(path), "--dtype", "float32", "--max-total-tokens", "8192")
    port = httpx.get(srv.url + "/server_info", timeout=10).json()["frontend_port"]
    srv.frontend = f"tcp://127.0.0.1:{port}"
    yield srv
    srv.stop()


def body(n: int, stream: bool) -> dict:
    return {"text": PROMPT, "stream": stream,
            "sampling_params": {"max_new_tokens": n, "ignore_eos": True, "temperature": 0}}


def exchange(address: str, req_id: str, req: dict, timeout_s: float = 900.0) -> tuple[int, list]:
    """Send one generate over a DEALER socket; (bytes received, the bodies of the replies) until done."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)  # as the DSL's link: a full pipe would make the server drop events
    try:
        sock.connect(address)
        sock.send(m.encode(m.FrontendReq(req_id, "generate", req)))
        total, bodies, deadline = 0, [], time.monotonic() + timeout_s
        pinged = time.monotonic()
        while time.monotonic() < deadline:
            if time.monotonic() - pinged > 1.0:  # a client silent for 10 s loses its requests (frontend_zmq)
                sock.send(m.encode(m.FrontendReq("ping", "ping")))
                pinged = time.monotonic()
            if not sock.poll(200):
                continue
            data = sock.recv()
            out = m.decode(data)
            if out.req_id == "ping":
                continue
            assert out.status == 200, out.body
            total += len(data)
            if out.done and out.body is None:  # a stream's end
                return total, bodies
            bodies.append(out.body)
            if out.done:
                return total, bodies
        raise AssertionError(f"no end of the reply within {timeout_s} s")
    finally:
        sock.close(0)
        ctx.term()


def joined(events: list[dict]) -> tuple[str, list[int]]:
    text, ids = "", []
    for e in events:
        assert "text_trim" not in e  # no stop string here
        text += e["text"]
        ids += e["output_ids"]
    return text, ids


def cumulative_bytes(events: list[dict]) -> int:
    """What the same stream weighs with the whole text and ids so far in every event (the old scheme)."""
    total, text, ids = 0, "", []
    for e in events:
        text, ids = text + e["text"], ids + e["output_ids"]
        total += len(m.encode(m.FrontendOut("r", 200, {**e, "text": text, "output_ids": ids}, False)))
    return total


def test_stream_bytes_grow_linearly_and_the_deltas_make_the_reply(server):
    sizes, old = {}, {}
    for n in (500, 1000):
        sizes[n], events = exchange(server.frontend, f"s{n}", body(n, True))
        old[n] = cumulative_bytes(events)
        assert len(events) == n  # stream_interval 1: one event a token
        assert events[-1]["meta_info"]["completion_tokens"] == n
        text, ids = joined(events)
        assert len(ids) == n
        if n == 500:  # greedy: the plain reply is the same text (checked once: the decode steps are the cost)
            _, plain = exchange(server.frontend, "plain", body(n, False))
            assert ids == plain[0]["output_ids"] and text == plain[0]["text"]
    print(f"ZeroMQ stream bytes: deltas {sizes}, the old scheme (whole text so far) {old}")
    assert sizes[1000] < 2.5 * sizes[500], sizes
    assert old[1000] > 3 * old[500], old  # the same check fails on the old scheme
    assert sizes[1000] / 1000 < 1000, sizes  # bytes per token: one delta and the meta_info, not the text so far


def test_a_dsl_stream_over_the_link_yields_the_plain_text(server):
    @sgl.function
    def story(s):
        s += PROMPT + sgl.gen("a", max_tokens=300, ignore_eos=True, temperature=0)

    backend = sgl.RuntimeEndpoint(server.frontend)
    try:
        assert backend.transport == "zmq"
        state = story.run(backend=backend, stream=True)
        chunks = list(state.text_iter("a"))  # how many: timing (a loaded machine may deliver one); the text: not
        plain = story.run(backend=backend)["a"]
        assert "".join(chunks) == state["a"] == plain
    finally:
        backend.shutdown()


def stop_across_tokens(url: str) -> str:
    """A stop string that starts inside one generated token and ends in the next, found nowhere earlier
    in the greedy text: streamed one token an event, its first part has gone out when it matches."""
    out = httpx.post(url + "/generate", timeout=120, json={
        "text": PROMPT, "return_logprob": True, "return_text_in_logprobs": True,
        "sampling_params": {"max_new_tokens": 40, "ignore_eos": True, "temperature": 0}}).json()
    pieces = [e[2] for e in out["meta_info"]["output_token_logprobs"]]
    assert "".join(pieces) == out["text"]
    for k in range(5, len(pieces) - 1):
        a, b = pieces[k], pieces[k + 1]
        if len(a) >= 2 and len(b) >= 2 and (a + b).isascii() and (a + b).isprintable():
            stop = a[-2:] + b[:2]
            if out["text"].find(stop) == len("".join(pieces[:k + 1])) - 2:
                return stop
    raise AssertionError(f"no usable token boundary in {pieces!r}")


def test_a_stop_string_cut_after_streaming_reads_the_same_on_every_link(server):
    """The final record trims text already sent: the raw ZeroMQ stream says so (text_trim), the plain reply
    and /generate's cumulative SSE end with the cut text, and a DSL program streaming over ZeroMQ is shown the
    text it is shown over HTTP (the stop's first characters included: they went out before the match)."""
    stop = stop_across_tokens(server.url)
    sp = {"max_new_tokens": 40, "ignore_eos": True, "temperature": 0, "stop": [stop]}
    req = {"text": PROMPT, "sampling_params": sp}
    plain = httpx.post(server.url + "/generate", json=req, timeout=120).json()
    assert plain["meta_info"]["finish_reason"]["type"] == "stop" and stop not in plain["text"]
    with httpx.stream("POST", server.url + "/generate", json={**req, "stream": True}, timeout=120) as r:
        events = [x for x in r.iter_lines() if x.startswith("data: {")]
    assert json.loads(events[-1][6:])["text"] == plain["text"]

    _, bodies = exchange(server.frontend, "stop", {**req, "stream": True})
    assert bodies[-1]["text"] == "" and bodies[-1]["text_trim"] == 2  # the stop's first 2 chars went out before
    text = "".join(b["text"] for b in bodies)
    assert text[: len(text) - 2] == plain["text"]

    @sgl.function
    def story(s):
        s += PROMPT + sgl.gen("a", max_tokens=40, ignore_eos=True, temperature=0, stop=[stop])

    chunks = {}
    for link in ("zmq", "http"):
        backend = sgl.RuntimeEndpoint(server.url, link=link)
        try:
            assert backend.transport == link
            chunks[link] = list(story.run(backend=backend, stream=True).text_iter("a"))
        finally:
            backend.shutdown()
    # how deltas group into chunks depends on timing (a loaded machine may deliver one); what they add up to does not
    assert "".join(chunks["zmq"]) == "".join(chunks["http"]) == text
