"""Anthropic's Messages API and the day-one compatibility routes against ONE real server on the embedded model
(--api-key, --chat-template FILE reading the variables `persona` and `reasoning_effort`), through the real
clients: the anthropic SDK (messages.create, a forced tool_use, a tool_result round trip, messages.stream,
count_tokens), LangChain's ChatAnthropic; the raw event stream; 4xx in Anthropic's error shape;
/tokenize + /detokenize against the tokenizer; chat_template_kwargs / reasoning_effort reaching the template.
Greedy texts are compared with the chat route's (itself checked against transformers in test_server.py)."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest

from server_utils import ServerProcess
from server_utils import assert_idle_and_whole

pytestmark = pytest.mark.slow
KEY = "anthropic-key"
TEMPLATE = ("{%- if persona is defined %}{{ '<|im_start|>system\\n' + persona + '<|im_end|>\\n' }}{% endif -%}"
            "{%- if reasoning_effort is defined %}{{ '<|im_start|>system\\neffort: ' + reasoning_effort + "
            "'<|im_end|>\\n' }}{% endif -%}"
            "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
            "{% endfor -%}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif -%}")
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
TOOLS = [{"name": "get_weather", "description": "The weather in a city", "input_schema": CITY}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
HI = [{"role": "user", "content": "Say hi"}]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("tmpl") / "chat.jinja"
    path.write_text(TEMPLATE)
    srv = ServerProcess("--dtype", "float32", "--max-total-tokens", "4096", "--api-key", KEY,
                        "--chat-template", str(path), "--debug-check-integrity")
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        yield c
        assert_idle_and_whole(c)


@pytest.fixture(scope="module")
def sdk(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def tokenizer(client):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(client.get("/get_model_info").json()["tokenizer_path"])


def chat(client, messages, **kw) -> dict:
    r = client.post("/v1/chat/completions", json={"model": "default", "messages": messages, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_messages_create_matches_the_chat_route_and_count_tokens(client, sdk):
    m = sdk.messages.create(model="default", max_tokens=5, messages=HI, extra_body=GREEDY)
    ref = chat(client, HI, max_tokens=5)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == ref["choices"][0]["message"]["content"]
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None and m.usage.output_tokens == 5
    prompt = m.usage.input_tokens + m.usage.cache_read_input_tokens
    assert prompt == ref["usage"]["prompt_tokens"]
    assert sdk.messages.count_tokens(model="default", messages=HI).input_tokens == prompt
    system = [{"type": "text", "text": "Be terse."}]
    with_system = sdk.messages.count_tokens(model="default", messages=HI, system=system)
    assert with_system.input_tokens == chat(client, [{"role": "system", "content": "Be terse."}, *HI],
                                            max_tokens=1)["usage"]["prompt_tokens"]


def test_forced_tool_use_and_a_tool_result_round_trip(client, sdk):
    m = sdk.messages.create(model="default", max_tokens=60, messages=ASK, tools=TOOLS,
                            tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)
    assert m.stop_reason == "tool_use"
    assert [b.type for b in m.content] == ["tool_use"]
    call = m.content[0]
    assert call.name == "get_weather" and call.id
    jsonschema.validate(call.input, CITY)
    history = [*ASK, {"role": "assistant", "content": m.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}]}]
    back = sdk.messages.create(model="default", max_tokens=8, messages=history, tools=TOOLS, extra_body=GREEDY)
    ref = chat(client, [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.input)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"}], max_tokens=8,
        tools=[{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                 "parameters": CITY}}])
    assert back.usage.input_tokens + back.usage.cache_read_input_tokens == ref["usage"]["prompt_tokens"]
    assert "".join(b.text for b in back.content if b.type == "text") == ref["choices"][0]["message"]["content"]
    longer = [*history[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "Sunny, 21 C, dry"}]}]}]
    n = sdk.messages.count_tokens(model="default", messages=history, tools=TOOLS).input_tokens
    assert sdk.messages.count_tokens(model="default", messages=longer, tools=TOOLS).input_tokens > n


def test_stream_reassembles_and_final_message(sdk):
    whole = sdk.messages.create(model="default", max_tokens=12, messages=HI, extra_body=GREEDY)
    with sdk.messages.stream(model="default", max_tokens=12, messages=HI, extra_body=GREEDY) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    with sdk.messages.stream(model="default", max_tokens=60, messages=ASK, tools=TOOLS,
                             tool_choice={"type": "any"}, extra_body=GREEDY) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert "input_json" in kinds and final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["tool_use"]
    jsonschema.validate(final.content[0].input, CITY)


def test_raw_event_stream_in_anthropics_order(server):
    body = {"model": "default", "max_tokens": 6, "messages": HI, "stream": True, **GREEDY}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = []
    for chunk in raw.strip().split("\n\n"):
        name, data = chunk.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data[len("data: "):])
        assert payload["type"] == name[len("event: "):]
        events.append(payload)
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    assert events[0]["message"]["usage"]["output_tokens"] == 0
    assert events[-2]["delta"]["stop_reason"] == "max_tokens" and events[-2]["usage"]["output_tokens"] == 6


def test_stop_sequence_names_the_string(sdk):
    free = sdk.messages.create(model="default", max_tokens=12, messages=HI, extra_body=GREEDY).content[0].text
    stop = free.split()[2]  # a word of the greedy reply: the same greedy run stops before it
    m = sdk.messages.create(model="default", max_tokens=12, messages=HI, stop_sequences=[stop], extra_body=GREEDY)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == free[:free.index(stop)]
    with sdk.messages.stream(model="default", max_tokens=12, messages=HI, stop_sequences=[stop],
                             extra_body=GREEDY) as s:
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop


def test_langchain_chat_anthropic_invoke(server, sdk):
    from langchain_anthropic import ChatAnthropic

    model = ChatAnthropic(model="default", base_url=server.url, api_key=KEY, max_tokens=6, temperature=0)
    reply = model.invoke("Say hi")
    ref = sdk.messages.create(model="default", max_tokens=6, messages=HI, extra_body=GREEDY)
    assert reply.content == ref.content[0].text
    assert reply.usage_metadata["output_tokens"] == 6


BAD = [
    ({"messages": HI}, "max_tokens"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "bogus"}]}]}, "bogus"),
    ({"max_tokens": 4, "messages": HI, "tool_choice": {"type": "anything"}}, "tool_choice"),
    ({"max_tokens": 4, "messages": HI, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
    ({"max_tokens": 4, "messages": HI, "tools": [{"type": "web_search_20250305", "name": "s"}]}, "server tools"),
    ({"max_tokens": 2000, "messages": HI, "thinking": {"type": "enabled", "budget_tokens": 1024}},
     "without --reasoning-parser"),
    ({"max_tokens": 4, "messages": HI, "frobnicate": 1}, "frobnicate"),
    ({"max_tokens": 0, "messages": HI}, "max_tokens"),
    ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "messages[0]"),
    ({"max_tokens": 4, "messages": HI, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
]


@pytest.mark.parametrize("body,named", BAD)
def test_bad_requests_answer_4xx_in_anthropics_shape(server, body, named):
    r = httpx.post(server.url + "/v1/messages", json={"model": "default", **body}, headers={"x-api-key": KEY},
                   timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert named in err["error"]["message"]


def test_model_key_and_method_errors_in_anthropics_shape(server, sdk):
    with pytest.raises(anthropic.NotFoundError, match="not_found_error"):
        sdk.messages.create(model="claude-nope", max_tokens=4, messages=HI)
    with pytest.raises(anthropic.AuthenticationError, match="authentication_error"):
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(
            model="default", max_tokens=4, messages=HI)
    r = httpx.get(server.url + "/v1/messages", headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 405 and r.json()["type"] == "error"
    r = httpx.post(server.url + "/v1/messages/count_tokens", json={"model": "default", "messages": "x"},
                   headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": HI}, headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == 401  # x-api-key: the Messages routes only


def test_tokenize_detokenize_round_trip_equals_the_tokenizer(client, tokenizer):
    text = "The quick brown fox jumps over the lazy dog. 🦊"
    r = client.post("/tokenize", json={"model": "default", "prompt": text, "add_special_tokens": True}).json()
    assert r["tokens"] == tokenizer.encode(text, add_special_tokens=True)
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] > 0
    back = client.post("/detokenize", json={"tokens": r["tokens"]}).json()
    assert back["prompt"] == back["text"] == tokenizer.decode(r["tokens"]) == text
    many = client.post("/v1/tokenize", json={"prompt": [text, "hello"]}).json()  # SGLang's list form
    assert many["tokens"] == [tokenizer.encode(t) for t in (text, "hello")] and many["count"] == [len(t) for t in
                                                                                                   many["tokens"]]
    assert client.post("/v1/detokenize", json={"tokens": many["tokens"]}).json()["text"] == [text, "hello"]
    strs = client.post("/tokenize", json={"prompt": "hello world", "return_token_strs": True}).json()["token_strs"]
    assert strs == tokenizer.convert_ids_to_tokens(tokenizer.encode("hello world"))
    for bad, named in (({"prompt": 3}, "prompt"), ({"tokens": ["a"]}, "tokens"), ({"prompt": "x", "nope": 1}, "nope"),
                       ({"prompt": "x", "messages": HI}, "one of them")):
        route = "/detokenize" if "tokens" in bad else "/tokenize"
        r = client.post(route, json=bad)
        assert r.status_code == 400 and named in r.json()["error"]["message"], r.text


def test_chat_template_kwargs_and_reasoning_effort_reach_the_template(client, sdk, tokenizer):
    persona = "You answer in one word."
    expected = (f"<|im_start|>system\n{persona}<|im_end|>\n<|im_start|>system\neffort: low<|im_end|>\n"
                "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer.encode(expected, add_special_tokens=False)
    kw = {"chat_template_kwargs": {"persona": persona}, "reasoning_effort": "low"}
    assert chat(client, HI, max_tokens=1, **kw)["usage"]["prompt_tokens"] == len(ids)
    assert client.post("/tokenize", json={"messages": HI, **kw}).json()["tokens"] == ids
    n = sdk.messages.count_tokens(model="default", messages=HI,
                                  extra_body={"chat_template_kwargs": {"persona": persona}, "output_config": {
                                      "effort": "low"}}).input_tokens
    assert n == len(ids)
    for bad, named in (({"chat_template_kwargs": ["x"]}, "chat_template_kwargs"),
                       ({"chat_template_kwargs": {"add_generation_prompt": False}}, "add_generation_prompt"),
                       ({"reasoning_effort": "extreme"}, "reasoning_effort")):
        r = client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 1, **bad})
        assert r.status_code == 400 and named in r.json()["error"]["message"], r.text


def test_a_final_assistant_turn_is_continued(client, sdk, tokenizer):
    """Assistant prefill: continue_final_message (vLLM / SGLang) on the chat route and /tokenize, and Anthropic's
    final assistant turn, render the prompt up to the final message's text (no end of turn, no new turn) and reply
    with the continuation only: the same greedy text as /generate from those ids."""
    prefill = [*HI, {"role": "assistant", "content": "Hi! My name"}]
    open_ids = tokenizer.encode("<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\nHi! My name",
                                add_special_tokens=False)
    assert client.post("/tokenize", json={"messages": prefill, "continue_final_message": True}).json()["tokens"] == \
        open_ids
    native = client.post("/generate", json={"input_ids": open_ids, "sampling_params": {
        "max_new_tokens": 6, "temperature": 0}}).json()["text"]
    assert native  # a continuation, compared below
    c = chat(client, prefill, max_tokens=6, continue_final_message=True)
    assert c["choices"][0]["message"]["content"] == native
    assert c["usage"]["prompt_tokens"] == len(open_ids)
    m = sdk.messages.create(model="default", max_tokens=6, messages=prefill, extra_body=GREEDY)
    assert m.content[0].text == native and m.usage.input_tokens + m.usage.cache_read_input_tokens == len(open_ids)
    assert sdk.messages.count_tokens(model="default", messages=prefill).input_tokens == len(open_ids)

    closed = tokenizer.encode("<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\nHi! My name<|im_end|>\n",
                              add_special_tokens=False)
    for kw, ids in (({"add_generation_prompt": False}, closed),
                    ({}, closed + tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False))):
        assert client.post("/tokenize", json={"messages": prefill, **kw}).json()["tokens"] == ids, kw
        assert chat(client, prefill, max_tokens=1, **kw)["usage"]["prompt_tokens"] == len(ids), kw

    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    for body, named in (({"messages": prefill, "continue_final_message": True, "add_generation_prompt": True},
                         "cannot both be true"),
                        ({"messages": [*HI, call], "continue_final_message": True}, "holds tool calls"),
                        ({"messages": prefill, "continue_final_message": "yes"}, "continue_final_message")):
        for route in ("/v1/chat/completions", "/tokenize"):
            r = client.post(route, json={**body, **({"max_tokens": 1} if route.startswith("/v1") else {})})
            assert r.status_code == 400 and named in r.json()["error"]["message"], (route, r.text)
    with pytest.raises(anthropic.BadRequestError, match="trailing whitespace"):
        sdk.messages.create(model="default", max_tokens=4, messages=[*HI, {"role": "assistant", "content": "Hi "}])
