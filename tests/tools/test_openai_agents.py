"""What agent frameworks send to /v1: logit_bias (OpenAI and native), tools / tool_choice with parsed
tool calls, tool results in the history. A real server on the embedded model (float32, so greedy
tokens are compared with transformers on the same weights), the `openai` SDK and httpx as clients."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch

from server_utils import FP32_FLAGS, shared_server


@pytest.fixture(scope="module")
def server():
    return shared_server(*FP32_FLAGS)  # requests only: one server for these flags, shared by the modules that use them


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120)


def hf_biased(hf_model, ids: list[int], n: int, bias: dict[int, float]) -> list[int]:
    """transformers' greedy continuation with `bias` added to the logits at every step."""

    def add_bias(_input_ids, scores):
        scores = scores.clone()
        for t, b in bias.items():
            scores[:, t] += b
        return scores

    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=2,
                                logits_processor=[add_bias])
    return out[0, len(ids):].tolist()


# ------------------------------------------------------------------------------------ logit_bias
def test_logit_bias_plus_100_forces_a_token_under_greedy(client, oai, engine_fp32):
    tok = engine_fp32.tokenizer
    forced = tok.encode(" banana", add_special_tokens=False)[0]
    sp = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True, "logit_bias": {str(forced): 100}}
    out = client.post("/generate", json={"text": "The capital of France is", "sampling_params": sp}).json()
    assert out["output_ids"] == [forced] * 4
    c = oai.completions.create(model="default", prompt="The capital of France is", max_tokens=3, temperature=0,
                               logit_bias={str(forced): 100})
    assert c.choices[0].text == tok.decode([forced] * 3)


def test_logit_bias_minus_100_on_the_greedy_token_matches_transformers(client, oai, engine_fp32, hf_model,
                                                                       hf_greedy):
    tok = engine_fp32.tokenizer
    text = "The capital of France is"
    ids = tok.encode(text, add_special_tokens=False)
    plain = hf_greedy(ids, 6)
    bias = {plain[0]: -100.0}
    want = hf_biased(hf_model, ids, 6, bias)
    assert want[0] != plain[0]
    sp = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True, "logit_bias": {str(plain[0]): -100}}
    out = client.post("/generate", json={"text": text, "sampling_params": sp}).json()
    assert out["output_ids"] == want
    # the chat route takes it too (the same mechanism: one more request, checked against transformers)
    msgs = [{"role": "user", "content": "Name a fruit."}]
    chat_ids = tok.encode(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                          add_special_tokens=False)
    first = hf_greedy(chat_ids, 1)[0]
    want = hf_biased(hf_model, chat_ids, 4, {first: -100.0})
    r = oai.chat.completions.create(model="default", messages=msgs, max_tokens=4, temperature=0,
                                    logit_bias={str(first): -100}, extra_body={"ignore_eos": True})
    assert r.choices[0].message.content == tok.decode(want)


@pytest.mark.parametrize("bias,needle", [
    ({"1": 100.5}, "logit_bias"), ({"1": "x"}, "logit_bias"), ({"-3": 1}, "logit_bias"),
    ({"abc": 1}, "logit_bias"), ({"1000000": 1}, "logit_bias keys must be token ids in [0, "), ([1, 2], "logit_bias"),
])
def test_bad_logit_bias_is_a_400_naming_it(client, bias, needle):
    for route, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
                        ("/v1/completions", {"prompt": "hi", "max_tokens": 1}),
                        ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}})):
        if route == "/generate":
            body = {**body, "sampling_params": {**body["sampling_params"], "logit_bias": bias}}
        else:
            body = {**body, "logit_bias": bias}
        r = client.post(route, json=body)
        assert r.status_code == 400, (route, r.text)
        err = r.json()["error"]
        assert needle in err["message"], (route, err)
        assert err["param"].endswith("logit_bias"), (route, err)


# ------------------------------------------------------------------------------------ tools
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in London?"}]
# the embedded model's tool format (SmolLM2: a JSON list in <tool_call>), forced through the regex extension so
# the 135M model writes a call; the parser still reads it from the text like any other output
ONE_CALL = r'<tool_call>\[\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,10}"\}\}\n\]</tool_call>'
TWO_CALLS = (r'<tool_call>\[\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,10}"\}\},\n'
             r'\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,10}"\}\}\n\]</tool_call>')


def reassemble(stream) -> tuple[str, list[dict], str]:
    """An openai SDK chat stream -> (content, tool calls, finish_reason), checking the delta protocol:
    a call's id / type / name come once, in its first delta; arguments only after it."""
    content, calls, finish = "", {}, None
    for ch in stream:
        if not ch.choices:
            continue
        c = ch.choices[0]
        content += c.delta.content or ""
        for tc in c.delta.tool_calls or []:
            if tc.id is not None:
                assert tc.index not in calls and tc.type == "function" and tc.function.name
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments or ""}
            else:
                assert tc.index in calls and tc.function.name is None
                calls[tc.index]["arguments"] += tc.function.arguments
        finish = c.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def as_dicts(tool_calls) -> list[dict]:
    return [{"id": t.id, "name": t.function.name, "arguments": t.function.arguments} for t in tool_calls or []]


def rendered_ids(tok, messages, tools=None) -> list[int]:
    from radixlang_runtime.server.chat_render import render_chat

    return tok.encode(render_chat(tok, messages, None, tools)[0], add_special_tokens=False)


def test_a_call_in_the_output_is_message_tool_calls(client, oai, engine_fp32):
    from radixlang_runtime.tool_parsers import get_parser

    req = dict(model="default", messages=ASK, tools=TOOLS, temperature=0, max_tokens=60, extra_body={"regex": ONE_CALL})
    r = oai.chat.completions.create(**req)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = as_dicts(choice.message.tool_calls)
    assert len(calls) == 1 and calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert set(json.loads(calls[0]["arguments"])) == {"city"}
    # the same greedy request on the native route gives the raw text: the route's calls are its parse
    ids = rendered_ids(engine_fp32.tokenizer, ASK, TOOLS)
    assert r.usage.prompt_tokens == len(ids)
    raw = client.post("/generate", json={"input_ids": ids, "sampling_params": {
        "temperature": 0, "max_new_tokens": 60, "regex": ONE_CALL}}).json()["text"]
    want = get_parser("hermes").parse(raw, {"get_weather"})
    assert [(c.name, c.arguments) for c in want.calls] == [(c["name"], c["arguments"]) for c in calls]
    # streamed: the same call, name once, arguments in pieces that add up
    content, streamed, finish = reassemble(oai.chat.completions.create(**req, stream=True))
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in streamed] == [(c["name"], c["arguments"]) for c in calls]


def test_parallel_tool_calls_false_keeps_the_first(oai):
    req = dict(model="default", messages=ASK, tools=TOOLS, temperature=0, max_tokens=80,
               extra_body={"regex": TWO_CALLS})
    both = as_dicts(oai.chat.completions.create(**req).choices[0].message.tool_calls)
    assert len(both) == 2
    one = oai.chat.completions.create(**req, parallel_tool_calls=False)
    assert one.choices[0].finish_reason == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in as_dicts(one.choices[0].message.tool_calls)] == \
        [(both[0]["name"], both[0]["arguments"])]
    _, streamed, finish = reassemble(oai.chat.completions.create(**req, parallel_tool_calls=False, stream=True))
    assert finish == "tool_calls" and [(c["name"], c["arguments"]) for c in streamed] == \
        [(both[0]["name"], both[0]["arguments"])]


def test_plain_text_with_tools_streams_as_it_answers(oai):
    """What the 135M model writes unforced: text. With tools on, the parser passes it through, and the
    stream adds up to the non-streamed reply of the same greedy request."""
    req = dict(model="default", messages=[{"role": "user", "content": "Tell me a joke."}], tools=TOOLS,
               temperature=0, max_tokens=24)
    r = oai.chat.completions.create(**req)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    content, calls, finish = reassemble(oai.chat.completions.create(**req, stream=True))
    assert (content, calls, finish) == (r.choices[0].message.content, [], r.choices[0].finish_reason)


def test_a_tool_result_round_trip_renders_and_answers(oai, engine_fp32, hf_greedy):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "London"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 C, light rain"}]
    tok = engine_fp32.tokenizer
    ids = rendered_ids(tok, history, TOOLS)
    prompt = tok.decode(ids)
    assert '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "London"}}\n]</tool_call>' in prompt
    assert "<tool_response>\n12 C, light rain\n</tool_response>" in prompt
    r = oai.chat.completions.create(model="default", messages=history, tools=TOOLS, temperature=0, max_tokens=12,
                                    extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == len(ids)
    assert r.choices[0].message.content == tok.decode(hf_greedy(ids, 12))
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "length"


def test_tool_choice_none_renders_no_tools(oai, engine_fp32):
    plain = len(rendered_ids(engine_fp32.tokenizer, ASK))
    r = oai.chat.completions.create(model="default", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=1)
    assert r.usage.prompt_tokens == plain
    r = oai.chat.completions.create(model="default", messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=1)
    assert r.usage.prompt_tokens == len(rendered_ids(engine_fp32.tokenizer, ASK, TOOLS)) > plain


TWO_TOOLS = TOOLS + [{"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 30}},
                                       "required": ["tz"]}}}]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_a_forced_tool_choice_makes_the_model_call(client, oai, engine_fp32, choice):
    """tool_choice required / named: the output is constrained to a call (the regex built from the
    parameters schema), so the 135M model calls a tool; the reply is the parse of what it wrote."""
    from radixlang_runtime.server.chat_render import CHATML_TOOLS_TEMPLATE
    from radixlang_runtime.server.openai_tools import check_tools, forced_call_regex, with_parser

    req = dict(model="default", messages=ASK, tools=TWO_TOOLS, tool_choice=choice, parallel_tool_calls=False,
               temperature=0, max_tokens=80)
    r = oai.chat.completions.create(**req)
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    calls = as_dicts(r.choices[0].message.tool_calls)
    assert len(calls) == 1
    args = json.loads(calls[0]["arguments"])
    if choice == "required":
        assert calls[0]["name"] in ("get_weather", "get_time")
    else:
        assert calls[0]["name"] == "get_time" and set(args) == {"tz"} and isinstance(args["tz"], str)
    # the raw greedy text under the same constraint, parsed here, is the reply
    body = {"tools": TWO_TOOLS, "tool_choice": choice, "parallel_tool_calls": False}
    plan = check_tools(body)
    plan = with_parser(plan, None, CHATML_TOOLS_TEMPLATE)
    ids = rendered_ids(engine_fp32.tokenizer, ASK, TWO_TOOLS)
    raw = client.post("/generate", json={"input_ids": ids, "sampling_params": {
        "temperature": 0, "max_new_tokens": 80, "regex": forced_call_regex(plan, True)}}).json()["text"]
    assert [(c.name, c.arguments) for c in plan.parser.parse(raw).calls] == [(c["name"], c["arguments"]) for c in calls]
    content, streamed, finish = reassemble(oai.chat.completions.create(**req, stream=True))
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in streamed] == [(c["name"], c["arguments"]) for c in calls]


@pytest.mark.parametrize("extra,param,needle", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not in tools"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "cannot be combined"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}}}],
      "tool_choice": "required"}, "tools", "anyOf is not supported with a forced tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "tool_choice must be"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", "1-64 letters"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools", "tools[0] must be"),
    ({"tools": TOOLS * 2}, "tools", "unique"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": "{not json"}}]}]}, "messages[1].tool_calls[0].function.arguments", "JSON"),
    ({"messages": ASK + [{"role": "tool", "content": "x"}]}, "messages[1].tool_call_id", "tool_call_id"),
    ({"functions": [{"name": "f"}]}, "functions", "not supported"),
])
def test_bad_tool_requests_are_400s_naming_the_field(client, extra, param, needle):
    r = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 1, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and needle in err["message"], err


def test_unknown_tool_call_parser_is_refused_by_name():
    from radixlang_runtime.server_args import ServerArgs

    with pytest.raises(ValueError, match="tool_call_parser 'nope'"):
        ServerArgs(tool_call_parser="nope")
    assert ServerArgs(tool_call_parser="qwen25").tool_call_parser == "qwen25"
