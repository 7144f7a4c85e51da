"""A real server (launch_server: HTTP process + scheduler + detokenizer over ZeroMQ) with real clients:
httpx for the native protocol, the `openai` SDK for /v1."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from server_utils import ServerProcess, assert_idle_and_whole, sse_events, stats

GREEDY = {"temperature": 0, "max_new_tokens": 16}


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--dtype", "float32", "--max-total-tokens", "8192", "--enable-metrics",
                        "--debug-check-integrity")
    yield srv
    assert srv.stop() in (0, 143), srv.tail()  # 143: uvicorn re-raises SIGTERM after its graceful shutdown


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


# ------------------------------------------------------------------------------------ native
def test_generate_greedy_matches_transformers(client, hf_greedy, engine_fp32):
    text = "The capital of France is"
    ids = engine_fp32.tokenizer.encode(text, add_special_tokens=False)
    out = client.post("/generate", json={"text": text, "sampling_params": {**GREEDY, "ignore_eos": True}}).json()
    assert out["output_ids"] == hf_greedy(ids, 16)
    assert out["text"] == engine_fp32.tokenizer.decode(out["output_ids"])
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == 16
    assert meta["finish_reason"] == {"type": "length", "length": 16}
    assert_idle_and_whole(client)


def test_generate_lists_ids_and_prefill_only(client):
    outs = client.post("/generate", json={
        "text": ["One, two,", "Red, green,"],
        "sampling_params": [{"max_new_tokens": 3, "temperature": 0}, {"max_new_tokens": 5, "temperature": 0}],
    }).json()
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [3, 5]
    by_ids = client.post("/generate", json={"input_ids": [[504, 2988, 314], [42, 43]],
                                            "sampling_params": {"max_new_tokens": 2, "temperature": 0}}).json()
    assert len(by_ids) == 2 and by_ids[0]["meta_info"]["prompt_tokens"] == 3
    warm = client.post("/generate", json={"text": "A long shared system prompt " * 8,
                                          "sampling_params": {"max_new_tokens": 0}}).json()
    assert warm["output_ids"] == [] and warm["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    again = client.post("/generate", json={"text": "A long shared system prompt " * 8 + "and more",
                                           "sampling_params": {"max_new_tokens": 1}}).json()
    assert again["meta_info"]["cached_tokens"] >= 32
    assert_idle_and_whole(client)


def test_streaming_is_cumulative_and_ends_with_done(client):
    body = {"text": "Once upon a time", "sampling_params": GREEDY}
    plain = client.post("/generate", json=body).json()
    with client.stream("POST", "/generate", json={**body, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) >= 2 and all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    for a, b in zip(chunks, chunks[1:]):
        assert b["text"].startswith(a["text"]) and b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
    assert chunks[-1]["text"] == plain["text"] and chunks[-1]["output_ids"] == plain["output_ids"]


def test_info_and_control_routes(client, server):
    for route in ("/model_info", "/get_model_info"):
        info = client.get(route).json()
        assert info["is_generation"] and info["served_model_name"] == "SmolLM2-135M-Instruct"
    for route in ("/server_info", "/get_server_info"):
        info = client.get(route).json()
        assert info["port"] == server.port and info["page_size"] == 16 and "version" in info
        graphs = info["stats"]["cuda_graph"]  # decode under CUDA graphs: off on the CPU, the reason named
        assert graphs["mode"] == "off" and graphs["reason"].startswith("device cpu") and not info["disable_cuda_graph"]
    assert client.get("/health").status_code == 200
    assert client.get("/ping").status_code == client.post("/ping").status_code == 200  # vLLM's name
    assert client.get("/version").json() == {"version": info["version"]}
    assert client.get("/health_generate").status_code == 200
    assert client.post("/concate_and_append_request", json={"src_rids": ["a"], "dst_rid": "b"}).json() == {}
    client.post("/generate", json={"text": "cache me " * 10, "sampling_params": {"max_new_tokens": 1}})
    assert stats(client)["cached_slots"] > 0
    r = client.post("/flush_cache")
    assert r.status_code == 200 and stats(client)["cached_slots"] == 0
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == "SmolLM2-135M-Instruct" and models["data"][0]["max_model_len"] == 8192


def test_abort_request_by_rid(client):
    async def run():
        async with httpx.AsyncClient(base_url=str(client.base_url), timeout=60) as ac:
            task = asyncio.create_task(ac.post("/generate", json={
                "text": "Count:", "rid": "to-abort",
                "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True, "temperature": 0}}))
            await asyncio.sleep(1.0)
            assert (await ac.post("/abort_request", json={"rid": "to-abort"})).status_code == 200
            return (await task).json()

    out = asyncio.run(run())
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < out["meta_info"]["completion_tokens"] < 2000
    assert_idle_and_whole(client)


HOSTILE = [
    ("/generate", b"{not json"),
    ("/generate", [1, 2, 3]),
    ("/generate", {}),
    ("/generate", {"text": "a", "input_ids": [1]}),
    ("/generate", {"text": 5}),
    ("/generate", {"text": []}),
    ("/generate", {"input_ids": []}),
    ("/generate", {"input_ids": [1, 999999]}),
    ("/generate", {"input_ids": [-1]}),
    ("/generate", {"input_ids": ["a", "b"]}),
    ("/generate", {"text": "a", "sampling_params": {"foo": 1}}),
    ("/generate", {"text": "a", "sampling_params": {"temperature": "hot"}}),
    ("/generate", {"text": "a", "sampling_params": {"top_p": 0}}),
    ("/generate", {"text": "a", "sampling_params": {"top_k": 0}}),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": -1}}),
    ("/generate", {"text": "a", "sampling_params": {"min_new_tokens": 5, "max_new_tokens": 2}}),
    ("/generate", {"text": "a", "sampling_params": {"stop": 5}}),
    ("/generate", {"text": "a", "sampling_params": {"regex": "[0-9"}}),
    ("/generate", {"text": "a", "sampling_params": {"stop_regex": "[0-9"}}),
    ("/generate", {"text": "a", "sampling_params": {"stop_regex": [3]}}),
    ("/generate", {"input_ids": [1] * 9000}),
    ("/generate", {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 1}]}),
    ("/generate", {"text": "a", "rid": 7}),
    ("/generate", {"text": "a", "sampling_params": "greedy"}),
    ("/abort_request", {}),
    ("/v1/chat/completions", {"model": "default"}),
    ("/v1/chat/completions", {"model": "default", "messages": [{"role": "wizard", "content": "hi"}]}),
    ("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": 3}]}),
    ("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": "hi"}],
                              "response_format": {"type": "json_schema", "json_schema": {"schema": {"not": {}}}}}),
    ("/v1/completions", {"model": "default", "prompt": "hi", "n": 0}),
    ("/v1/completions", {"model": "default", "prompt": "hi", "logprobs": 50}),
    ("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}),
    ("/generate", {"text": "a b c", "return_logprob": True, "logprob_start_len": 99}),
    ("/generate", {"text": "a b c", "return_logprob": True, "top_logprobs_num": -1}),
    ("/v1/completions", {"model": "default", "prompt": {"x": 1}}),
    ("/v1/completions", {"model": "default", "prompt": "hi", "temperature": -1}),
]


@pytest.mark.parametrize("route,body", HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_hostile_requests_get_a_4xx_json_error(client, route, body):
    if isinstance(body, bytes):
        r = client.post(route, content=body)
    else:
        r = client.post(route, json=body)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]


def test_server_still_answers_after_hostile_requests(client):
    out = client.post("/generate", json={"text": "Still alive?", "sampling_params": {"max_new_tokens": 2}}).json()
    assert out["meta_info"]["completion_tokens"] == 2
    assert_idle_and_whole(client)


def test_disconnect_mid_stream_frees_the_request(client):
    before = client.get("/metrics").text
    body = {"text": "Tell me a long story.", "stream": True,
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    with client.stream("POST", "/generate", json=body) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 6:
                break  # leaving the block closes the connection mid-stream
    assert_idle_and_whole(client, timeout=30)
    after = client.get("/metrics").text
    aborted = "radixlang:num_aborted_requests_total"
    assert _metric(after, aborted) == _metric(before, aborted) + 1


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_64_concurrent_streams_complete_and_are_counted(client, server):
    before = _metric(client.get("/metrics").text, "radixlang:num_requests_total")

    async def one(ac: httpx.AsyncClient, i: int) -> dict:
        body = {"text": f"Item {i}:", "stream": True, "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
        async with ac.stream("POST", "/generate", json=body) as r:
            events = sse_events([line async for line in r.aiter_lines()])
        assert events[-1] == "[DONE]"
        return events[-2]

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=300, limits=httpx.Limits(max_connections=100)) as ac:
            return await asyncio.gather(*(one(ac, i) for i in range(64)))

    finals = asyncio.run(run())
    assert all(f["meta_info"]["completion_tokens"] == 8 and f["meta_info"]["finish_reason"] for f in finals)
    metrics = client.get("/metrics").text
    assert _metric(metrics, "radixlang:num_requests_total") >= before + 64
    for name in ("radixlang:time_to_first_token_seconds_count", "radixlang:generation_tokens_total",
                 "radixlang:token_usage", "radixlang:cache_hit_rate", "radixlang:num_queue_reqs"):
        _metric(metrics, name)
    served = client.get("/v1/models").json()["data"][0]["id"]  # SGLang's spelling of the same counter
    assert _metric(metrics, f'sglang:num_requests_total{{model_name="{served}"}}') == \
        _metric(metrics, "radixlang:num_requests_total")
    assert_idle_and_whole(client)


def test_select_style_scoring_equals_the_engine(client, engine_fp32):
    """The SGLang frontend's select: prefill the prefix, then one call scoring every choice."""
    prefix = "Q: Which animal barks? Think about pets and farms before you answer. A:"
    warm = client.post("/generate", json={"text": prefix, "sampling_params": {"max_new_tokens": 0}}).json()
    n = warm["meta_info"]["prompt_tokens"]
    choices = [" dog", " cat", " a very large whale"]
    body = {"text": [prefix + c for c in choices], "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True, "logprob_start_len": max(n - 2, 0), "return_text_in_logprobs": True}
    outs = client.post("/generate", json=body).json()
    ref = engine_fp32.generate([prefix + c for c in choices], {"max_new_tokens": 0}, return_logprob=True,
                               logprob_start_len=max(n - 2, 0), return_text_in_logprobs=True)
    for o, r in zip(outs, ref):
        got, want = o["meta_info"]["input_token_logprobs"], r["meta_info"]["input_token_logprobs"]
        assert [e[1:] for e in got] == [e[1:] for e in want]  # same tokens, same texts
        assert max(abs(a[0] - b[0]) for a, b in zip(got, want)) < 2e-4
        assert o["meta_info"]["cached_tokens"] >= 16 and "output_token_logprobs" in o["meta_info"]
    # unconditional likelihood: the choices' tokens alone, from position 0
    alone = client.post("/generate", json={"input_ids": [engine_fp32.tokenizer.encode(c) for c in choices],
                                           "sampling_params": {"max_new_tokens": 0}, "return_logprob": True}).json()
    assert all(a["meta_info"]["input_token_logprobs"][0][0] is None for a in alone)


def test_streamed_logprobs_are_deltas(client):
    body = {"text": "Logprobs, please:", "stream": True, "return_logprob": True, "top_logprobs_num": 2,
            "sampling_params": {"max_new_tokens": 6, "min_new_tokens": 6, "temperature": 0}}
    with client.stream("POST", "/generate", json=body) as r:
        events = sse_events(r.iter_lines())[:-1]
    total = 0
    for ev in events:
        m = ev["meta_info"]
        total += len(m["output_token_logprobs"])
        assert m["output_token_logprobs_length"] == total == len(ev["output_ids"])
        assert all(len(row) == 2 for row in m["output_top_logprobs"])
    assert "input_token_logprobs" in events[0]["meta_info"] and total == 6
    plain = client.post("/generate", json={**body, "stream": False}).json()["meta_info"]["output_token_logprobs"]
    streamed = [e for ev in events for e in ev["meta_info"]["output_token_logprobs"]]
    assert [e[1] for e in streamed] == [e[1] for e in plain]


# ------------------------------------------------------------------------------------ OpenAI SDK
def test_openai_chat_and_stream(oai, engine_fp32, hf_greedy):
    messages = [{"role": "user", "content": "Name three fruits."}]
    # min_tokens (an extension) masks EOS as transformers' min_new_tokens does: 16 tokens to compare.
    r = oai.chat.completions.create(model="default", messages=messages, max_tokens=16, temperature=0,
                                    extra_body={"min_tokens": 16})
    prompt = engine_fp32.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = engine_fp32.tokenizer.encode(prompt, add_special_tokens=False)
    assert r.choices[0].message.content == engine_fp32.tokenizer.decode(hf_greedy(ids, 16), skip_special_tokens=True)
    assert r.choices[0].message.role == "assistant" and r.usage.prompt_tokens == len(ids)
    chunks = list(oai.chat.completions.create(model="default", messages=messages, max_tokens=16, temperature=0,
                                              stream=True, stream_options={"include_usage": True},
                                              extra_body={"min_tokens": 16}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == r.choices[0].finish_reason
    # vLLM's continuous_usage_stats: every chunk carries the usage so far, growing to the final figures
    every = list(oai.chat.completions.create(model="default", messages=messages, max_tokens=16, temperature=0,
                                             stream=True, extra_body={"min_tokens": 16}, stream_options={
                                                 "include_usage": True, "continuous_usage_stats": True}))
    assert "".join(c.choices[0].delta.content for c in every if c.choices and c.choices[0].delta.content) == text
    used = [c.usage.completion_tokens for c in every]
    assert used[0] == 0 and used == sorted(used) and used[-1] == 16
    assert all(c.usage.prompt_tokens == len(ids) and c.usage.total_tokens == len(ids) + c.usage.completion_tokens
               for c in every)
    plain = [c for c in oai.completions.create(model="default", prompt="1, 2, 3,", max_tokens=6, temperature=0,
                                               stream=True, extra_body={"min_tokens": 6}, stream_options={
                                                   "include_usage": True, "continuous_usage_stats": True})]
    assert all(c.usage is not None for c in plain) and plain[-1].usage.completion_tokens == 6
    # The same conversation again: the prompt comes from the radix cache.
    r2 = oai.chat.completions.create(model="default", messages=messages, max_tokens=4, temperature=0)
    assert r2.usage.prompt_tokens_details.cached_tokens >= 16


def test_openai_completions_n_stop_seed(oai, engine_fp32):
    prompts = ["1, 2, 3,", "a, b, c,"]
    r = oai.completions.create(model="default", prompt=prompts, max_tokens=6, n=2, temperature=0,
                               extra_body={"min_tokens": 6})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text and r.choices[2].text == r.choices[3].text  # greedy samples agree
    assert r.usage.completion_tokens == 4 * 6
    assert r.usage.prompt_tokens == sum(len(engine_fp32.tokenizer.encode(p, add_special_tokens=False)) for p in prompts)
    s = oai.completions.create(model="default", prompt="The first sentence. The second", max_tokens=30, temperature=0,
                               stop=["."])
    assert "." not in s.choices[0].text and s.choices[0].finish_reason == "stop"
    a = oai.completions.create(model="default", prompt="Random word:", max_tokens=8, temperature=1.0, seed=11)
    b = oai.completions.create(model="default", prompt="Random word:", max_tokens=8, temperature=1.0, seed=11)
    assert a.choices[0].text == b.choices[0].text
    streamed = "".join(c.choices[0].text for c in oai.completions.create(
        model="default", prompt="1, 2, 3,", max_tokens=6, temperature=0, stream=True, extra_body={"min_tokens": 6})
        if c.choices)
    assert streamed == r.choices[0].text


def test_openai_logprobs(oai, client):
    r = oai.completions.create(model="default", prompt="Two plus two is", max_tokens=4, temperature=0, logprobs=2,
                               extra_body={"min_tokens": 4})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 4 and "".join(lp.tokens) == r.choices[0].text
    assert all(len(top) == 2 and max(top.values()) >= v - 1e-6 for top, v in zip(lp.top_logprobs, lp.token_logprobs))
    e = oai.completions.create(model="default", prompt="Two plus two is", max_tokens=1, temperature=0, logprobs=0,
                               echo=True)
    assert e.choices[0].logprobs.token_logprobs[0] is None and len(e.choices[0].logprobs.tokens) >= 5
    c = oai.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                    temperature=0, logprobs=True, top_logprobs=3)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens and all(len(x.top_logprobs) == 3 for x in content)
    assert all(x.logprob <= 0 and x.top_logprobs[0].logprob >= x.logprob - 1e-6 for x in content)
    # vLLM's return_tokens_as_token_ids: the same entries, each token named "token_id:N" (N its id)
    ids = oai.completions.create(model="default", prompt="Two plus two is", max_tokens=4, temperature=0, logprobs=2,
                                 extra_body={"min_tokens": 4, "return_tokens_as_token_ids": True}).choices[0]
    native = client.post("/generate", json={
        "text": "Two plus two is", "sampling_params": {"max_new_tokens": 4, "min_new_tokens": 4,
                                                        "temperature": 0}}).json()
    assert ids.logprobs.tokens == [f"token_id:{t}" for t in native["output_ids"]]
    assert ids.logprobs.token_logprobs == lp.token_logprobs and ids.text == r.choices[0].text
    assert all(k.startswith("token_id:") for top in ids.logprobs.top_logprobs for k in top)
    cid = oai.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                      temperature=0, logprobs=True, top_logprobs=3,
                                      extra_body={"return_tokens_as_token_ids": True}).choices[0].logprobs.content
    assert [x.logprob for x in cid] == [x.logprob for x in content]
    assert all(x.token.startswith("token_id:") and x.bytes == list(x.token.encode()) for x in cid)
    assert all(t.token.startswith("token_id:") for x in cid for t in x.top_logprobs)


def test_openai_errors_are_exceptions_with_messages(oai):
    with pytest.raises(openai.BadRequestError, match="top_p"):
        oai.completions.create(model="default", prompt="x", max_tokens=2, top_p=5)
