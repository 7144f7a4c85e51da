"""The /v1/responses pieces that need no server: the bounded store, the body -> chat body mapping, the
event sequence, and the chain's rendered prefix on the embedded model's chat template."""

from __future__ import annotations

import json

import pytest

from radixlang_runtime.protocol.limits import FieldError
from radixlang_runtime.server.responses_output import OutputShape, ResponseEvents, conversation_turn, output_items
from radixlang_runtime.server.responses_request import input_messages, parse_responses_body
from radixlang_runtime.server.responses_store import ResponseNotFound, ResponsesStore


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_store_evicts_oldest_by_entries_and_bytes_and_expires():
    clock = Clock()
    store = ResponsesStore(max_entries=3, max_bytes=10_000, ttl_s=60, clock=clock)
    for i in range(5):
        assert store.put(f"r{i}", {"id": f"r{i}"}, [{"role": "user", "content": "x"}])
    assert store.stats()["entries"] == 3
    with pytest.raises(ResponseNotFound, match="'r1'"):
        store.get("r1")
    assert store.get("r4").response == {"id": "r4"}
    big = "y" * 4000
    store.put("b1", {"id": "b1"}, [{"role": "user", "content": big}])
    store.put("b2", {"id": "b2"}, [{"role": "user", "content": big}])
    store.put("b3", {"id": "b3"}, [{"role": "user", "content": big}])  # 3 x 4 KB > 10 KB: b1 goes
    assert store.stats()["bytes"] <= 10_000
    with pytest.raises(ResponseNotFound):
        store.get("b1")
    assert store.get("b3").conversation[0]["content"] == big
    assert not store.put("huge", {"id": "huge"}, [{"role": "user", "content": "z" * 20_000}])  # alone over the cap
    clock.now = 61.0
    with pytest.raises(ResponseNotFound):
        store.get("b3")
    assert store.stats() == {"entries": 0, "bytes": 0}
    store.put("d", {"id": "d"}, [])
    store.delete("d")
    with pytest.raises(ResponseNotFound):
        store.delete("d")


def test_body_maps_onto_the_chat_body():
    req = parse_responses_body({
        "model": "default", "instructions": "Be brief.", "input": "hi", "max_output_tokens": 7, "temperature": 0,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}],
        "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": False,
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}, "verbosity": "low"},
        "reasoning": {"effort": "none"}, "include": [], "store": False, "metadata": {"k": "v"}})
    body = req.with_history([{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "ok"}])
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "earlier"},
                                {"role": "assistant", "content": "ok"}, {"role": "user", "content": "hi"}]
    assert body["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"},
                                                              "strict": True}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["max_completion_tokens"] == 7 and body["parallel_tool_calls"] is False
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "s", "schema": {"type": "object"}}}
    assert req.store is False and req.echo["metadata"] == {"k": "v"}


def test_input_items_become_chat_messages():
    items = [{"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
             {"type": "message", "role": "assistant", "id": "m", "status": "completed",
              "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
             {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
             {"type": "reasoning", "id": "rs", "summary": []},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]
    assert input_messages(items) == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Let me look.",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny", "name": "get_weather"}]


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "frobnicate": 1}, "frobnicate"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include"),
    ({"input": "x", "include": "reasoning.encrypted_content"}, "include"),
    ({"input": "x", "reasoning": {"effort": "none", "summary": "long"}}, "reasoning.summary"),
    ({"input": "x", "reasoning": {"generate_summary": True}}, "reasoning.generate_summary"),
    ({"input": "x", "top_logprobs": 2}, "top_logprobs"),
    ({"input": "x", "top_logprobs": 21, "include": ["message.output_text.logprobs"]}, "top_logprobs"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "bm90IG91cnM="}]},
     "input[0].encrypted_content"),
    ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": "x", "text": {"verbosity": "loud"}}, "text.verbosity"),
    ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}, "input[0].content[0]"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0].arguments"),
    ({"input": "x", "reasoning": {"context": "all_turns"}}, "reasoning.context"),
    ({}, "input"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "metadata": {"k": 1}}, "metadata"),
])
def test_bad_fields_are_refused_by_name(body, param):
    with pytest.raises(FieldError) as e:
        parse_responses_body(body)
    assert e.value.param == param


def _events(chunks: list[bytes]) -> list[dict]:
    return [json.loads(c[len(b"data: "):]) for c in chunks]


def test_event_sequence_for_text_then_a_call():
    ev = ResponseEvents({"id": "resp_x", "object": "response"})
    chunks = ev.start() + ev.text("Hel") + ev.text("lo") + ev.chat_delta(
        {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]})
    chunks += ev.chat_delta({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]})
    chunks += ev.chat_delta({"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]})
    tail, final = ev.finish({"input_tokens": 1}, "tool_calls")
    events = _events(chunks + tail)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert events[6]["text"] == "Hello" and events[12]["arguments"] == "{\"a\": 1}"
    assert [o["type"] for o in final["output"]] == ["message", "function_call"]
    assert final["output"][1]["call_id"] == "call_1" and final["status"] == "completed"
    assert conversation_turn(final["output"]) == [{"role": "assistant", "content": "Hello", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}]


def test_output_items_of_a_message_with_reasoning_and_calls():
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    items = output_items({"role": "assistant", "content": None, "reasoning_content": "think", "tool_calls": [call]})
    assert [i["type"] for i in items] == ["reasoning", "function_call"]
    assert items[0]["content"] == [{"type": "reasoning_text", "text": "think"}]


def test_sealed_reasoning_opens_onto_the_assistant_turn_after_it():
    items = output_items({"role": "assistant", "content": "Paris.", "reasoning_content": "capital of France"},
                         OutputShape(summary=True, sealed=True))
    rs = items[0]
    assert rs["summary"] == [{"type": "summary_text", "text": "capital of France"}] == \
        [{**p, "type": "summary_text"} for p in rs["content"]]
    back = [{"role": "user", "content": "Capital?"}, {k: v for k, v in rs.items() if k != "content"}, items[1],
            {"role": "user", "content": "And Spain?"}]
    assert input_messages(back) == [
        {"role": "user", "content": "Capital?"},
        {"role": "assistant", "content": "Paris.", "reasoning_content": "capital of France"},
        {"role": "user", "content": "And Spain?"}]
    sealed = rs["encrypted_content"]
    for changed in (sealed[:-4] + ("AAAA" if sealed[-4:] != "AAAA" else "BBBB"), sealed[:40], sealed + "x" * 4):
        with pytest.raises(FieldError) as e:
            input_messages([{**back[1], "encrypted_content": changed}])
        assert e.value.param == "input[0].encrypted_content"
    plain = output_items({"role": "assistant", "content": "Paris.", "reasoning_content": "capital of France"})
    assert plain[0]["summary"] == [] and "encrypted_content" not in plain[0]


def test_event_sequence_for_a_summarized_reasoning_then_text_with_logprobs():
    ev = ResponseEvents({"id": "resp_x", "object": "response"}, OutputShape(summary=True, sealed=True))
    lp = [{"token": t, "logprob": -1.0, "bytes": list(t.encode()), "top_logprobs": []} for t in ("a", "b", "c")]
    ev.add_logprobs(lp[:1])
    chunks = ev.start() + ev.reasoning("thin") + ev.reasoning("king")
    ev.add_logprobs(lp[1:2])
    chunks += ev.text("Hi")
    ev.add_logprobs(lp[2:])  # a last token without text (the end of the turn)
    tail, final = ev.finish({"input_tokens": 1}, "stop")
    events = _events(chunks + tail)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.reasoning_summary_part.added", "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta", "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta"] == ["thin", "king"]
    assert events[12]["part"] == {"type": "summary_text", "text": "thinking"}
    # the last token goes out on an empty delta: the deltas carry each token once, the done event all
    assert (events[16]["delta"], events[16]["logprobs"]) == ("Hi", lp[:2])
    assert (events[17]["delta"], events[17]["logprobs"]) == ("", lp[2:]) and events[18]["logprobs"] == lp
    rs, msg = final["output"]
    assert rs["summary"] == [{"type": "summary_text", "text": "thinking"}] and rs["encrypted_content"]
    assert input_messages([rs, msg])[0]["reasoning_content"] == "thinking"
    assert msg["content"][0]["logprobs"] == lp and msg["content"][0]["text"] == "Hi"


def _lps(*tokens: str) -> list[dict]:
    return [{"token": t, "logprob": -1.0, "bytes": list(t.encode()), "top_logprobs": []} for t in tokens]


def _sent(events: list[dict]) -> list[dict]:
    return [lp for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]


def test_logprobs_after_the_last_text_delta_are_sent_before_the_next_item():
    ev = ResponseEvents({"id": "resp_x", "object": "response"})
    lp = _lps("a", "b", "<call>")
    ev.add_logprobs(lp[:1])
    chunks = ev.start() + ev.text("a")
    ev.add_logprobs(lp[1:2])  # its text held back, then no more text: a call starts
    chunks += ev.chat_delta({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                             "function": {"name": "f", "arguments": "{}"}}]})
    tail, final = ev.finish({"input_tokens": 1}, "tool_calls")
    events = _events(chunks + tail)
    kinds = [e["type"] for e in events]
    assert kinds.index("response.output_text.done") == kinds.index("response.output_text.delta") + 2
    assert _sent(events) == lp[:2] == final["output"][0]["content"][0]["logprobs"]
    assert [o["type"] for o in final["output"]] == ["message", "function_call"]


def test_a_reply_of_only_reasoning_streams_a_message_with_its_logprobs():
    """As output_items does for the same message: the reasoning item, then an empty message carrying every
    token's logprobs (an empty delta, then the done events)."""
    lp = _lps("th", "ink")
    ev = ResponseEvents({"id": "resp_x", "object": "response"})
    ev.add_logprobs(lp[:1])
    chunks = ev.start() + ev.reasoning("th")
    ev.add_logprobs(lp[1:])
    tail, final = ev.finish({"input_tokens": 1}, "length")
    events = _events(chunks + tail)
    items = output_items({"role": "assistant", "content": None, "reasoning_content": "think"}, logprobs=lp)
    assert [o["type"] for o in final["output"]] == [o["type"] for o in items] == ["reasoning", "message"]
    assert final["output"][1]["content"] == items[1]["content"] == [
        {"type": "output_text", "text": "", "annotations": [], "logprobs": lp}]
    assert _sent(events) == lp and [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == [""]
    assert [e["logprobs"] for e in events if e["type"] == "response.output_text.done"] == [lp]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    # without logprobs asked no empty delta: the message's added / done events only
    ev = ResponseEvents({"id": "resp_y", "object": "response"})
    events = _events(ev.start() + ev.reasoning("th") + ev.finish({"input_tokens": 1}, "length")[0])
    assert "response.output_text.delta" not in [e["type"] for e in events]


def test_a_chain_renders_each_turn_as_a_prefix_of_the_next():
    """The embedded model's template: turn N's prompt (with its reply) starts turn N+1's prompt, with and
    without tools, so a previous_response_id chain's history is a radix-cache prefix."""
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import resolve_model_dir
    from radixlang_runtime.server.chat_render import render_chat

    tok = AutoTokenizer.from_pretrained(resolve_model_dir(None, None))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for with_tools in (None, tools):
        history: list[dict] = [{"role": "system", "content": "Be brief."}]
        prev = None
        for turn in range(4):
            history.append({"role": "user", "content": f"question {turn}"})
            text, _ = render_chat(tok, history, None, with_tools)
            if prev is not None:
                assert text.startswith(prev)
            reply = {"role": "assistant", "content": f"answer {turn}"}
            if with_tools and turn == 1:
                reply["tool_calls"] = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
            history.append(reply)
            prev = text + reply["content"]


def test_the_sealing_key_is_kept_for_the_next_start(tmp_path):
    from radixlang_runtime.server.responses_sealed import machine_key

    path = tmp_path / "keys" / "seal.key"
    first = machine_key(str(path))
    assert len(first) == 32 and machine_key(str(path)) == first  # a restarted server reads it back
    assert path.stat().st_mode & 0o777 == 0o600
    (tmp_path / "a_file").write_text("")
    alone = machine_key(str(tmp_path / "a_file" / "seal.key"))  # cannot be written (root too): this process's own
    assert len(alone) == 32 and alone != first and machine_key(str(tmp_path / "a_file" / "seal.key")) != alone
