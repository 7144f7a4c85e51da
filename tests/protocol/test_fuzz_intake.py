"""Strict intake against one real server (launch_server with --api-key and the ZeroMQ frontend): no
input reaches a 500, every refusal is a 4xx in the one error shape naming the field, the keep-alive
connection survives errors, a big text tokenizes off the event loop, the API key never leaves.

Hypothesis drives the native /generate and the OpenAI /v1/completions and /v1/chat/completions body
shapes with wrong types, huge and tiny numbers (+-2^64, +-1e308, NaN / Infinity / 1e400 as raw JSON
text), strings with lone surrogates and NULs, deep nesting and unknown fields (derandomized: the same
examples on every run). Generated bodies that are valid ask for at most 3 new tokens, so each case
answers fast; every case must answer below 500 within CASE_BOUND_S.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import types

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_bodies import (AUTH, CASE_BOUND_S, FUZZ, SERVED, Tally, assert_idle_and_whole, assert_serves, check_case,
                         client_addr, deep, either, hostile, ids, j, max_tokens, post_raw, texts)
from server_utils import KEYED_FLAGS, KEYED_KEY, free_port, shared_server

KEY = KEYED_KEY
LIMIT = 32 << 20  # the default --max-request-body-bytes


@pytest.fixture(scope="module")
def server():
    """The session's keyed server (test_zmq_hostile's too; its clean exit is checked when the session ends)."""
    srv = shared_server(*KEYED_FLAGS, frontend=True)
    yield srv
    assert KEY not in srv.tail(10**7), "the API key was logged"


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=CASE_BOUND_S, headers=AUTH,
                      limits=httpx.Limits(max_connections=1)) as c:
        yield c


# ------------------------------------------------------------------------------ regressions
SP = {"max_new_tokens": 2}
CHAT = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
CMPL = {"model": "default", "prompt": "hi", "max_tokens": 2}
# (route, body, status, the field the message names)
REGRESSIONS = {
    "top_k_2^64": ("/generate", j({"text": "a", "sampling_params": {**SP, "top_k": 2**64}}), 400, "top_k"),
    "seed_2^64": ("/generate", j({"text": "a", "sampling_params": {**SP, "sampling_seed": 2**64}}), 400,
                  "sampling_seed"),
    "openai_seed_2^64": ("/v1/completions", j({**CMPL, "seed": 2**64}), 400, "seed"),
    "pin_ids_2^64": ("/pin_prefix", j({"input_ids": [1, 2**64]}), 400, "input_ids[1]"),
    "lone_surrogate": ("/generate", b'{"text": "a\\ud800b", "sampling_params": {"max_new_tokens": 2}}', 400, "text"),
    "surrogate_in_chat": ("/v1/chat/completions",
                          b'{"messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 2}', 400,
                          "messages[0].content"),
    "nested_1e5": ("/generate", deep(100_000), 400, "nests deeper than 64"),
    "nested_65": ("/generate", b'{"text": "a", "x": ' + deep(64) + b"}", 400, "nests deeper than 64"),
    "skip_special_no": ("/generate", j({"text": "a", "sampling_params": {**SP, "skip_special_tokens": "no"}}), 400,
                        "skip_special_tokens"),
    "echo_ids_-1": ("/v1/completions", j({**CMPL, "prompt": [5, -1], "echo": True}), 400, "prompt"),
    "echo_ids_1.5": ("/v1/completions", j({**CMPL, "prompt": [5, 1.5], "echo": True}), 400, "prompt"),
    "stream_no": ("/generate", j({"text": "a", "stream": "no", "sampling_params": SP}), 400, "stream"),
    "openai_stream_no": ("/v1/chat/completions", j({**CHAT, "stream": "no"}), 400, "stream"),
    "ignore_eos_no": ("/generate", j({"text": "a", "sampling_params": {**SP, "ignore_eos": "no"}}), 400, "ignore_eos"),
    "temperature_Infinity": ("/generate", b'{"text": "a", "sampling_params": {"temperature": Infinity}}', 400,
                             "sampling_params.temperature"),
    "temperature_NaN": ("/v1/completions", b'{"prompt": "a", "max_tokens": 2, "temperature": NaN}', 400,
                        "temperature"),
    "top_p_1e400": ("/generate", b'{"text": "a", "sampling_params": {"top_p": 1e400}}', 400, "top_p"),
    "stop_token_ids_true": ("/generate", j({"text": "a", "sampling_params": {**SP, "stop_token_ids": [True]}}), 400,
                            "stop_token_ids[0]"),
    "best_of_2": ("/v1/completions", j({**CMPL, "best_of": 2}), 400, "best_of"),
    "suffix_no_fim_tokens": ("/v1/completions", j({**CMPL, "suffix": "!"}), 400, "suffix"),
    "infill_no_fim_tokens": ("/infill", j({"input_prefix": "a", "input_suffix": "b"}), 400, "suffix needs"),
    "tokenize_suffix_no_fim_tokens": ("/tokenize", j({"prompt": "a", "suffix": "b"}), 400, "suffix needs"),
    "logit_bias_101": ("/v1/chat/completions", j({**CHAT, "logit_bias": {"42": 101}}), 400, "logit_bias"),
    "logit_bias_id": ("/v1/completions", j({**CMPL, "logit_bias": {"99999999": 1}}), 400, "logit_bias"),
    "logit_bias_native": ("/generate", j({"text": "a", "sampling_params": {**SP, "logit_bias": {"x": 1}}}), 400,
                          "logit_bias"),
    "unknown_openai_field": ("/v1/chat/completions", j({**CHAT, "frobnicate": 1}), 400, "frobnicate"),
    "native_n_1000": ("/generate", j({"text": "a", "sampling_params": {**SP, "n": 1000}}), 400, "n"),
    "openai_n_1000": ("/v1/completions", j({**CMPL, "n": 1000}), 400, "n"),
    "text_list_1025": ("/generate", j({"text": ["a"] * 1025, "sampling_params": SP}), 400, "text"),
    "prompts_x_n": ("/generate", j({"text": ["a"] * 20, "sampling_params": {**SP, "n": 64}}), 400, "n"),
    "rid_300_chars": ("/generate", j({"text": "a", "rid": "r" * 300, "sampling_params": SP}), 400, "rid"),
    "int_of_5000_digits": ("/generate", b'{"text": "a", "rid": ' + b"9" * 5000 + b"}", 400, "not valid JSON"),
    "abort_rid_type": ("/abort_request", j({"rid": 7}), 400, "rid"),
    "ttl_nan": ("/pin_prefix", b'{"input_ids": [1, 2], "ttl_s": NaN}', 400, "ttl_s"),
}


@pytest.mark.parametrize("name", list(REGRESSIONS))
def test_regressions_answer_the_exact_4xx_naming_the_field(client, name):
    route, body, status, field = REGRESSIONS[name]
    r, data, _ = post_raw(client, route, body)
    assert r.status_code == status, data[:400]
    err = json.loads(data)["error"]
    assert field in err["message"], err
    assert err["code"] == status and err["type"] == "invalid_request_error"
    after = client.post("/generate", json={"text": "ok", "sampling_params": {"max_new_tokens": 1}})
    assert after.status_code == 200
    assert client_addr(after) == r.addr, "the error closed the keep-alive connection"


def test_unknown_model_is_an_openai_404(client):
    r = client.post("/v1/completions", json={**CMPL, "model": "gpt-17"})
    assert r.status_code == 404
    assert r.json()["error"] == {**r.json()["error"], "param": "model", "code": "model_not_found"}
    assert "gpt-17" in r.json()["error"]["message"]
    for name in ("default", SERVED):  # what /v1/models serves, and the alias the README and SDK examples use
        assert client.post("/v1/completions", json={**CMPL, "model": name}).status_code == 200
    assert client.get("/v1/models").json()["data"][0]["id"] == SERVED


def test_informational_openai_fields_are_taken(client):
    r = client.post("/v1/chat/completions", json={**CHAT, "user": "u-1", "metadata": {"k": "v"}, "store": False,
                                                  "tool_choice": "none", "tools": [], "logit_bias": {}})
    assert r.status_code == 200, r.text
    r = client.post("/v1/completions", json={**CMPL, "user": "u-1", "best_of": 1, "suffix": None, "logit_bias": None})
    assert r.status_code == 200, r.text


def test_routing_errors_use_the_one_error_shape(client):
    r = client.get("/no/such/route")
    assert r.status_code == 404 and r.json()["error"]["message"] == "Not Found"
    r = client.get("/generate")
    assert r.status_code == 405 and r.json()["error"]["code"] == 405 and r.headers["allow"] == "POST"


def test_bodies_over_the_limit_answer_413_before_being_read(client):
    r, data, _ = post_raw(client, "/generate", b" " * (LIMIT + 1))  # Content-Length says it: nothing is read
    assert r.status_code == 413 and "max-request-body-bytes" in json.loads(data)["error"]["message"]

    def chunks():  # no Content-Length: the read stops at the limit
        yield b'{"text": "'
        for _ in range(LIMIT // (1 << 20) + 1):
            yield b"y" * (1 << 20)
        yield b'"}'

    with client.stream("POST", "/generate", content=chunks()) as r:
        assert r.status_code == 413 and "max-request-body-bytes" in json.loads(r.read())["error"]["message"]
    assert_serves(client)


# ------------------------------------------------------------------------------ the event loop
def test_health_answers_while_a_big_text_tokenizes(server):
    """4 MB of text tokenizes for seconds; /health must not wait for it (it took 18 s during 10 MB)."""
    big = {"text": "The quick brown fox jumps over the lazy dog. " * 90_000, "sampling_params": SP}

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=300, headers=AUTH) as ac:
            task = asyncio.create_task(ac.post("/generate", json=big))
            await asyncio.sleep(0.3)  # the body is on its way / being tokenized
            waits = []
            while not task.done():  # bounded: the big request ends (400) once tokenized
                t0 = time.monotonic()
                assert (await ac.get("/health")).status_code == 200
                waits.append(time.monotonic() - t0)
                await asyncio.sleep(0.1)
            return waits, await task

    waits, r = asyncio.run(run())
    assert len(waits) >= 2, "the big request ended before /health was measured: make the text bigger"
    assert max(waits) < 1.0, waits
    assert r.status_code == 400 and "context length" in r.json()["error"]["message"]


# ------------------------------------------------------------------------------ secrets
def test_server_info_redacts_the_api_key_on_both_links(client, server):
    import radixlang as sgl

    info = client.get("/server_info").json()
    assert info["api_key"] == "<redacted>" and KEY not in json.dumps(info)
    zmq = sgl.RuntimeEndpoint(f"tcp://127.0.0.1:{server.frontend_port}", api_key=KEY, timeout=60)
    try:
        zinfo = zmq.get_server_info()
        assert zinfo["api_key"] == "<redacted>" and KEY not in json.dumps(zinfo)
        from radixlang.errors import BackendError

        with pytest.raises(BackendError, match="ignore_eos") as e:  # the ZeroMQ link parses through the same intake
            zmq._call({"text": "a", "sampling_params": {"max_new_tokens": 1, "ignore_eos": "no"}})
        assert e.value.status == 400
        ok = zmq._call({"text": "a", "sampling_params": {"max_new_tokens": 1, "ignore_eos": True}})
        assert ok["meta_info"]["completion_tokens"] == 1
    finally:
        zmq.shutdown()


# ------------------------------------------------------------------------------ a 500 keeps the connection
def test_an_unexpected_exception_answers_500_and_keeps_the_connection():
    """A route bug (here a KeyError) is a JSON 500 on a connection that serves the next request.
    Real uvicorn over a real socket; the app's state is a stub (no route here touches the runtime)."""
    import uvicorn

    from radixlang_runtime.protocol.limits import RuntimeLimits
    from radixlang_runtime.server.http_server import ServerState, create_app
    from radixlang_runtime.server_args import ServerArgs

    async def healthy():  # TokenizerManager.health: None = healthy
        return None

    tm = types.SimpleNamespace(dead=None, metrics=None, limits=RuntimeLimits(64, 100, 64), tokenizer=None,
                               health=healthy)
    app = create_app(ServerState(ServerArgs(), tm, "/nowhere", "stub", {}))

    @app.get("/boom")
    async def boom():
        return {}["missing"]

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.config.port}", timeout=10) as c:
            for _ in range(5):  # it failed the next request 7 times in 10
                r = c.get("/boom")
                assert r.status_code == 500 and "KeyError" in r.json()["error"]["message"]
                ok = c.get("/health")
                assert ok.status_code == 200 and client_addr(ok) == client_addr(r)
    finally:
        server.should_exit = True
        thread.join(10)


# ------------------------------------------------------------------------------ fuzz
SAMPLING = {
    "min_new_tokens": st.integers(0, 2), "temperature": st.floats(0, 2), "top_p": st.floats(0.1, 1),
    "top_k": st.sampled_from([-1, 1, 5, 10**6]), "min_p": st.floats(0, 1), "frequency_penalty": st.floats(-2, 2),
    "presence_penalty": st.floats(-2, 2), "repetition_penalty": st.floats(0.5, 2),
    "stop": st.text(min_size=1, max_size=3) | st.lists(st.text(min_size=1, max_size=3), max_size=2),
    "stop_token_ids": st.lists(st.integers(0, 100), max_size=3), "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(), "spaces_between_special_tokens": st.booleans(),
    "no_stop_trim": st.booleans(), "n": st.integers(1, 3), "sampling_seed": st.integers(-(2**63), 2**63 - 1),
}
# grammar fields only with values that are refused (a valid one would compile for seconds)
GRAMMAR = {"regex": hostile.filter(lambda v: not isinstance(v, str)),
           "json_schema": hostile.filter(lambda v: not isinstance(v, str))}


def _long_defaults(v) -> bool:
    """sampling_params that would run with the default 128 new tokens (null, {}, a list of them)."""
    return v is None or v == {} or (isinstance(v, list) and any(x is None or x == {} for x in v))


native_body = st.fixed_dictionaries(
    {"sampling_params": st.one_of(
        *[st.fixed_dictionaries({"max_new_tokens": max_tokens},
                                optional={**{k: either(v) for k, v in SAMPLING.items()}, **GRAMMAR})] * 2,
        hostile.filter(lambda v: not _long_defaults(v)))},
    optional={"text": either(texts | st.lists(texts, min_size=1, max_size=3)),
              "input_ids": either(ids | st.lists(ids, min_size=1, max_size=3)),
              "stream": either(st.booleans()), "rid": either(st.text(min_size=1, max_size=8)),
              "return_logprob": either(st.booleans()), "logprob_start_len": either(st.integers(-1, 3)),
              "top_logprobs_num": either(st.integers(0, 3)), "return_text_in_logprobs": either(st.booleans()),
              "unknown_top_level": hostile})
OPENAI_COMMON = {
    "model": either(st.sampled_from(["default", SERVED])), "n": either(st.integers(1, 2)),
    "stream": either(st.booleans()), "stream_options": either(st.fixed_dictionaries({}, optional={
        "include_usage": either(st.booleans())})),
    "temperature": either(st.floats(0, 2)), "top_p": either(st.floats(0.1, 1)), "seed": either(st.integers()),
    "stop": either(st.text(min_size=1, max_size=3)), "presence_penalty": either(st.floats(-2, 2)),
    "frequency_penalty": either(st.floats(-2, 2)), "user": either(texts),
    "logit_bias": either(st.just({}) | st.dictionaries(st.sampled_from(["1", "42", "x", "-1", "99999999"]),
                                                       st.floats(-150, 150), max_size=3) | hostile),
    "top_k": either(st.sampled_from([-1, 3])), "ignore_eos": either(st.booleans()),
    "stop_token_ids": either(st.lists(st.integers(0, 100), max_size=2)), "min_tokens": either(st.integers(0, 2)),
    "response_format": either(st.just({"type": "text"})),
}
completion_body = st.fixed_dictionaries(
    {"max_tokens": max_tokens},
    optional={**OPENAI_COMMON, "prompt": either(texts | st.lists(texts, min_size=1, max_size=2) | ids),
              "echo": either(st.booleans()), "logprobs": either(st.integers(0, 3)),
              "best_of": either(st.sampled_from([1, 2])), "suffix": either(st.just(""))})
FUZZ_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
_tool_call = st.fixed_dictionaries({"id": texts, "type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": texts, "arguments": st.sampled_from(['{"city": "Paris"}', "{}", "{bad", "[1]"]) | hostile})})
messages = st.lists(st.one_of(
    st.fixed_dictionaries({"role": either(st.sampled_from(["system", "user", "assistant"])),
                           "content": either(texts | st.lists(st.fixed_dictionaries(
                               {"type": st.just("text"), "text": texts}), max_size=2))}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none(),
                           "tool_calls": st.lists(_tool_call, max_size=2) | hostile}),
    st.fixed_dictionaries({"role": st.just("tool"), "content": texts}, optional={"tool_call_id": texts | hostile})),
    min_size=1, max_size=3)
chat_body = st.fixed_dictionaries(
    {"max_tokens": max_tokens, "messages": either(messages)},
    optional={**OPENAI_COMMON, "logprobs": either(st.booleans()), "top_logprobs": either(st.integers(0, 3)),
              # a forced tool_choice (required / named) with tools compiles a grammar (seconds): left out
              "tools": either(st.just([]) | st.just(FUZZ_TOOLS) | hostile),
              "tool_choice": either(st.sampled_from(["none", "auto"]) | hostile),
              "parallel_tool_calls": either(st.booleans() | hostile),
              "max_completion_tokens": max_tokens})


@pytest.fixture
def tally(client):
    t = Tally()
    yield t
    assert_serves(client)
    assert_idle_and_whole(client)


@settings(FUZZ, max_examples=90)
@given(body=native_body)
def test_fuzz_native_generate(client, tally, body):
    check_case(client, "/generate", body, tally)


@settings(FUZZ, max_examples=50)
@given(body=completion_body)
def test_fuzz_openai_completions(client, tally, body):
    check_case(client, "/v1/completions", body, tally)


@settings(FUZZ, max_examples=50)
@given(body=chat_body)
def test_fuzz_openai_chat(client, tally, body):
    check_case(client, "/v1/chat/completions", body, tally)
