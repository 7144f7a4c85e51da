"""--reasoning-parser on a real server (the embedded model, `qwen3` format). The 135M model does not
think unprompted, so a `regex` forces a `<think>...</think>` block; the same greedy request on /generate
gives the raw text, and the chat route's reply must be the parser's split of it (stop strings and tool
calls applied to the content only), streamed or not; a continued assistant prefill is split from where it
left off."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from radixlang_runtime.model.loader.resolve import resolve_model_dir
from radixlang_runtime.reasoning_parser import get_reasoning_parser
from server_utils import ServerProcess

THINK = r"<think>\n[a-z]{2,8} [a-z ]{2,24}\n</think>\n\n"  # reasoning with a space in it
ANSWER = THINK + r"[A-Z][a-z]{1,8} [a-z ,]{2,24}\."
ONE_CALL = r'<tool_call>\[\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,10}"\}\}\n\]</tool_call>'
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in London?"}]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--reasoning-parser", "qwen3", "--max-total-tokens", "4096")
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120)


@pytest.fixture(scope="module")
def raw(server):
    """The same greedy request on /generate: the text the chat route splits."""
    tok = AutoTokenizer.from_pretrained(resolve_model_dir(None))
    from radixlang_runtime.server.chat_render import render_chat

    def run(regex: str, messages=ASK, tools=None, max_tokens=64, turn=None, **sp) -> str:
        prompt = render_chat(tok, messages, None, tools, None, *([turn] if turn else []))[0]
        r = httpx.post(server.url + "/generate", timeout=120, json={"text": prompt, "sampling_params": {
            "temperature": 0, "max_new_tokens": max_tokens, "regex": regex, **sp}})
        return r.json()["text"]

    return run


def streamed(oai, **req) -> tuple[str, str, list[dict], str, dict]:
    reasoning, content, calls, finish, use = "", "", {}, None, None
    for ch in oai.chat.completions.create(**req, stream=True, stream_options={"include_usage": True}):
        if ch.usage is not None:
            use = ch.usage
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        reasoning += getattr(d, "reasoning_content", None) or ""
        content += d.content or ""
        for tc in d.tool_calls or []:
            calls.setdefault(tc.index, {"name": tc.function.name, "arguments": ""})
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    return reasoning, content, [calls[i] for i in sorted(calls)], finish, use


def test_reasoning_is_split_from_the_answer(oai, raw):
    want = get_reasoning_parser("qwen3").parse(raw(ANSWER))
    assert want.reasoning and want.content  # the regex made both
    req = dict(model="default", messages=ASK, temperature=0, max_tokens=64, extra_body={"regex": ANSWER})
    r = oai.chat.completions.create(**req)
    m = r.choices[0].message
    assert (m.reasoning_content, m.content, r.choices[0].finish_reason) == (want.reasoning, want.content, "stop")
    details = r.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < r.usage.completion_tokens
    reasoning, content, calls, finish, use = streamed(oai, **req)
    assert (reasoning, content, calls, finish) == (want.reasoning, want.content, [], "stop")
    assert use.completion_tokens_details.reasoning_tokens == details.reasoning_tokens
    # logprobs: one entry per output token, also when the route reads the output as a stream
    r = oai.chat.completions.create(**req, logprobs=True)
    assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens
    # stream_reasoning false: the reasoning comes whole, in one delta
    chunks = [ch.choices[0].delta for ch in oai.chat.completions.create(
        **{**req, "extra_body": {"regex": ANSWER, "stream_reasoning": False}}, stream=True) if ch.choices]
    assert [getattr(d, "reasoning_content", None) for d in chunks if getattr(d, "reasoning_content", None)] == \
        [want.reasoning]
    # separate_reasoning false: the raw text is the content
    r = oai.chat.completions.create(**{**req, "extra_body": {"regex": ANSWER, "separate_reasoning": False}})
    assert r.choices[0].message.content == raw(ANSWER)


def test_stop_strings_apply_after_the_reasoning(oai, raw):
    want = get_reasoning_parser("qwen3").parse(raw(ANSWER))
    assert " " in want.reasoning and " " in want.content
    req = dict(model="default", messages=ASK, temperature=0, max_tokens=64, stop=[" "], extra_body={"regex": ANSWER})
    r = oai.chat.completions.create(**req)
    m = r.choices[0].message
    assert (m.reasoning_content, m.content, r.choices[0].finish_reason) == \
        (want.reasoning, want.content.split(" ")[0], "stop")
    reasoning, content, _, finish, _ = streamed(oai, **req)
    assert (reasoning, content, finish) == (want.reasoning, want.content.split(" ")[0], "stop")
    # n = 2 streamed: each choice is cut (and its runtime request aborted) on its own
    got = {}
    for ch in oai.chat.completions.create(**req, n=2, stream=True):
        for c in ch.choices:
            g = got.setdefault(c.index, ["", "", None])
            g[0] += getattr(c.delta, "reasoning_content", None) or ""
            g[1] += c.delta.content or ""
            g[2] = c.finish_reason or g[2]
    assert got == {i: [want.reasoning, want.content.split(" ")[0], "stop"] for i in (0, 1)}


def test_tool_calls_are_parsed_after_the_reasoning_only(oai, raw):
    after = THINK + ONE_CALL
    want = get_reasoning_parser("qwen3").parse(raw(after, tools=TOOLS))
    req = dict(model="default", messages=ASK, tools=TOOLS, temperature=0, max_tokens=80, extra_body={"regex": after})
    r = oai.chat.completions.create(**req)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and m.reasoning_content == want.reasoning
    assert [c.function.name for c in m.tool_calls] == ["get_weather"]
    assert set(json.loads(m.tool_calls[0].function.arguments)) == {"city"}
    reasoning, content, calls, finish, _ = streamed(oai, **req)
    assert (reasoning, content, finish) == (want.reasoning, "", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", m.tool_calls[0].function.arguments)]
    # a call written inside the reasoning is reasoning text, not a call
    inside = r"<think>\n" + ONE_CALL + r"\n</think>\n\n[A-Z][a-z]{2,10}\."
    r = oai.chat.completions.create(**{**req, "extra_body": {"regex": inside}})
    m = r.choices[0].message
    assert m.tool_calls is None and "<tool_call>" in m.reasoning_content and r.choices[0].finish_reason == "stop"


def test_a_forced_call_may_follow_reasoning(oai):
    r = oai.chat.completions.create(model="default", messages=ASK, tools=TOOLS, tool_choice="required",
                                    temperature=0, max_tokens=80)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and m.tool_calls[0].function.name == "get_weather"
    assert "<tool_call>" not in (m.reasoning_content or "")


def test_a_continued_prefill_is_split_from_where_it_left_off(oai, raw):
    """continue_final_message with a prefill that opened the reasoning: the parser reads the prefill first, so
    the rest of the reasoning is reasoning_content and the answer the content (read alone, the output does not
    open with <think> and would all be content). The request's grammar waits for the reasoning's end, which a
    thinking budget forces (the model does not close it unprompted)."""
    from radixlang_runtime.server.chat_render import CONTINUE_FINAL

    prefill = [*ASK, {"role": "assistant", "content": "<think>\nabout the"}]
    rest = r"[A-Z][a-z]{1,8} [a-z ,]{2,24}\."  # the answer's grammar
    text = raw(rest, messages=prefill, turn=CONTINUE_FINAL, thinking_token_budget=4)
    p = get_reasoning_parser("qwen3")()
    p.feed("<think>\nabout the")
    want = p.feed(text)
    want += p.finish()
    assert want.reasoning and want.content and "</think>" not in want.content
    assert get_reasoning_parser("qwen3").parse(text).content == text  # what an unprimed parser would answer
    req = dict(model="default", messages=prefill, temperature=0, max_tokens=64,
               extra_body={"regex": rest, "continue_final_message": True, "thinking_token_budget": 4})
    m = oai.chat.completions.create(**req).choices[0].message
    assert (m.reasoning_content, m.content) == (want.reasoning, want.content)
    reasoning, content, _, finish, use = streamed(oai, **req)
    assert (reasoning, content, finish) == (want.reasoning, want.content, "stop")
    assert 0 < use.completion_tokens_details.reasoning_tokens < use.completion_tokens
