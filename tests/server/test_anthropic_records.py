"""The Messages API's pieces without a server: a request's translation into the chat request it runs as
(system, content blocks, tools, tool_choice, output_config), the errors that name the field, and the event
stream built from text deltas (thinking blocks from a reasoning parser, tool_use from the hermes parser,
stop reasons), checked against the whole-text answer of the same parsers."""

from __future__ import annotations

import asyncio
import json

import pytest

from radixlang_runtime.protocol.limits import FieldError
from radixlang_runtime.server.anthropic_api import message_events
from radixlang_runtime.server.anthropic_errors import _reshaped, anthropic_error
from radixlang_runtime.server.anthropic_records import parse_messages_request
from radixlang_runtime.server.openai_reasoning import reasoning_plan
from radixlang_runtime.server.openai_tools import check_tools, with_parser

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_blocks_tools_and_choice_translate_to_the_chat_request():
    req = parse_messages_request({
        "model": "default", "max_tokens": 9, "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                              {"type": "text", "text": "t"},
                                              {"type": "tool_use", "id": "tu1", "name": "f", "input": {"city": "x"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1",
                                          "content": [{"type": "text", "text": "ok"}]},
                                         {"type": "text", "text": "next"}]}],
        "tools": [{"name": "f", "description": "d", "input_schema": CITY}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "stop_sequences": ["END"],
        "temperature": 0.5, "top_k": 3, "metadata": {"user_id": "u"},
        "output_config": {"format": {"type": "json_schema", "schema": CITY}, "effort": "low"}})
    body = req.chat_body()
    assert body["messages"] == [
        {"role": "system", "content": "AB"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "t", "tool_calls": [
            {"id": "tu1", "type": "function", "function": {"name": "f", "arguments": '{"city": "x"}'}}],
         "reasoning_content": "hm"},
        {"role": "tool", "tool_call_id": "tu1", "content": "ok"}, {"role": "user", "content": "next"}]
    assert body["tools"] == [{"type": "function", "function": {"name": "f", "description": "d", "parameters": CITY}}]
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert body["stop"] == ["END"] and body["temperature"] == 0.5 and body["top_k"] == 3 and body["max_tokens"] == 9
    assert body["response_format"]["json_schema"]["schema"] == CITY and body["reasoning_effort"] == "low"
    assert check_tools(body).forced == "required"
    named = parse_messages_request({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "q"}],
                                    "tools": [{"name": "f", "input_schema": CITY}],
                                    "tool_choice": {"type": "tool", "name": "f"}}).chat_body()
    assert named["tool_choice"] == {"type": "function", "function": {"name": "f"}}


@pytest.mark.parametrize("patch,named", [
    ({"max_tokens": None}, "max_tokens"),
    ({"model": None}, "model"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "document"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}]}, "extra"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]}, "user turn"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]},
     "tool_use"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 3}]}]}, "tool_use_id"),
    ({"tool_choice": {"type": "any"}}, "needs tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"stop_sequences": [""]}, "stop_sequences"),
    ({"system": 3}, "system"),
    ({"output_config": {"format": {"type": "regex"}}}, "output_config.format"),
    ({"container": "c"}, "container"),
    ({"thinking": {"type": "adaptive"}}, "thinking must be"),
    ({"thinking": {"type": "enabled"}}, "budget_tokens: Field required"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1023}, "max_tokens": 4096}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 1024}, "must be greater than"),
    ({"thinking": {"type": "disabled", "budget_tokens": 1024}}, "thinking.budget_tokens: Extra inputs"),
    ({"messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": 3}]}]}, "thinking"),
    ({"messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "x": 1}]}]},
     r"\.x: Extra inputs"),
    ({"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "t"}]}]}, "user turn"),
])
def test_bad_fields_are_named(patch, named):
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "q"}], **patch}
    with pytest.raises((FieldError, ValueError), match=named):
        parse_messages_request({k: v for k, v in body.items() if v is not None})


def test_thinking_becomes_a_budget_and_the_enable_thinking_template_variable():
    def body(**kw) -> dict:
        return parse_messages_request({"model": "m", "max_tokens": 2048, "messages": [{"role": "user", "content": "q"}],
                                       **kw}).chat_body()

    on = body(thinking={"type": "enabled", "budget_tokens": 1500})
    assert on["thinking_token_budget"] == 1500 and on["chat_template_kwargs"] == {"enable_thinking": True}
    off = body(thinking={"type": "disabled"}, chat_template_kwargs={"x": 1})
    assert "thinking_token_budget" not in off and off["chat_template_kwargs"] == {"x": 1, "enable_thinking": False}
    mine = body(thinking={"type": "disabled"}, chat_template_kwargs={"enable_thinking": True})
    assert mine["chat_template_kwargs"] == {"enable_thinking": True}  # the client's own variable wins
    assert "chat_template_kwargs" not in body() and "thinking_token_budget" not in body()


def test_count_tokens_takes_no_max_tokens_and_refuses_stream():
    assert parse_messages_request({"model": "m", "messages": [{"role": "user", "content": "q"}]}, True).max_tokens \
        is None
    with pytest.raises(FieldError, match="stream"):
        parse_messages_request({"model": "m", "messages": [{"role": "user", "content": "q"}], "stream": True}, True)


def test_error_shape_rewrite():
    body = json.dumps({"error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": 400}})
    assert json.loads(_reshaped(404, body.encode())) == anthropic_error(404, "bad") == \
        {"type": "error", "error": {"type": "not_found_error", "message": "bad"}}
    assert _reshaped(400, b"not json") is None


def snapshots(text: str, cut: int, finish: dict) -> list[dict]:
    """The runtime's text deltas of `text` in pieces of `cut` characters; the last carries the finish."""
    pieces = [text[i:i + cut] for i in range(0, len(text), cut)]
    return [{"text": p, "output_ids": [0], "meta_info": {
        "finish_reason": finish if i == len(pieces) - 1 else None, "prompt_tokens": 10, "cached_tokens": 4,
        "completion_tokens": i + 1}} for i, p in enumerate(pieces)]


def run_events(outs: list[dict], plan, think, stops=()) -> list[dict]:
    async def gen():
        for o in outs:
            yield o

    async def collect():
        return [chunk async for chunk in message_events(gen(), "msg_1", "m", plan, think, list(stops))]

    events = []
    for raw in asyncio.run(collect()):
        name, data = raw.decode().strip().split("\n")
        events.append(json.loads(data[len("data: "):]))
        assert events[-1]["type"] == name[len("event: "):]
    return events


@pytest.mark.parametrize("cut", [1, 3, 1000])
def test_stream_events_thinking_text_and_tool_use(cut):
    think = reasoning_plan("qwen3", {})
    plan = check_tools({"tools": [{"type": "function", "function": {"name": "f", "parameters": CITY}}]})
    plan = with_parser(plan, "hermes", None)
    text = ('<think>\nweigh it\n</think>\n\nCalling.'
            '<tool_call>\n{"name": "f", "arguments": {"city": "Oslo"}}\n</tool_call>')
    events = run_events(snapshots(text, cut, {"type": "stop", "matched": 2}), plan, think)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [b["type"] for b in starts] == ["thinking", "text", "tool_use"] and starts[2]["name"] == "f"
    by_index: dict[int, str] = {}
    for e in events:
        if e["type"] == "content_block_delta":
            d = e["delta"]
            piece = d.get("thinking", d.get("text", d.get("partial_json")))
            by_index[e["index"]] = by_index.get(e["index"], "") + piece
    assert by_index[0] == "weigh it" and by_index[1] == "Calling."
    assert json.loads(by_index[2]) == {"city": "Oslo"}
    assert kinds.count("content_block_stop") == 3
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2]["usage"]["input_tokens"] == 6 and events[-2]["usage"]["cache_read_input_tokens"] == 4


def test_stream_stop_sequence_inside_a_reasoning_split_is_named():
    think = reasoning_plan("qwen3", {})
    think.stops = ["STOP"]
    events = run_events(snapshots("<think>a</think>Hello STOP more", 2, None), check_tools({}), think, ["STOP"])
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert text == "Hello "
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "STOP"}
