"""An assistant turn's reasoning in the history reaches the chat template (interleaved thinking): OpenAI chat's
`reasoning_content` / vLLM's `reasoning`, Anthropic's `thinking` blocks and the Responses API's `reasoning`
items all arrive as the message's `reasoning_content`. The templates here are small ones written to the rule of
Qwen3's own (the current turn's reasoning, after the last user message, shown before the assistant's text) and of
a template that keeps every turn's reasoning. On a real server, a turn sent back with its reasoning renders the
tokens the model wrote, so the prefix cache serves them."""

from __future__ import annotations

import re

import httpx
import pytest

from radixlang_runtime.protocol.limits import FieldError
from radixlang_runtime.server.anthropic_records import parse_messages_request
from radixlang_runtime.server.chat_render import render_chat
from radixlang_runtime.server.responses_request import input_messages
from server_utils import ServerProcess, assert_idle_and_whole

# Qwen3's rule: reasoning shown only for assistant turns after the last user message
CURRENT_TURN = (
    "{% set ns = namespace(last=0) %}"
    "{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and m.reasoning_content is string and loop.index0 > ns.last %}"
    "<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}{{ m.content }}"
    "{% for t in m.tool_calls or [] %}<tool_call>{{ t.function.name }}</tool_call>{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# every turn's reasoning kept
EVERY_TURN = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content is string %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# gpt-oss's rule: a tool-call turn's analysis from `thinking` (or its content), never both
HARMONY_RULE = (
    "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}"
    "{% if m.content and m.thinking %}{{ raise_exception('Cannot pass both content and thinking') }}{% endif %}"
    "{% if m.thinking or m.content %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking or m.content }}"
    "<|end|>{% endif %}<|start|>assistant to=functions.{{ m.tool_calls[0].function.name }}<|call|>"
    "{% else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}")
THOUGHT = "the user wants a city"


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    return AutoTokenizer.from_pretrained(embedded_tokenizer_dir())


def loop(reasoning: dict) -> list[dict]:
    """A user question, an assistant turn with its reasoning (these fields), a tool result."""
    return [{"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Looking it up.", **reasoning, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "Paris"}]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_the_current_turns_reasoning_is_rendered(tok, field):
    text = render_chat(tok, loop({field: THOUGHT}), CURRENT_TURN, None, {})[0]
    assert f"<|im_start|>assistant\n<think>\n{THOUGHT}\n</think>\n\nLooking it up.<tool_call>lookup</tool_call>" in text
    assert "<think>" not in render_chat(tok, loop({}), CURRENT_TURN, None, {})[0]
    # a later user message ends the turn: the template leaves that reasoning out
    later = render_chat(tok, [*loop({field: THOUGHT}), {"role": "user", "content": "And Spain?"}], CURRENT_TURN,
                        None, {})[0]
    assert THOUGHT not in later


@pytest.mark.parametrize("fields, named", [
    ({"reasoning_content": 3}, "messages[1].reasoning_content"),
    ({"reasoning": ["x"]}, "messages[1].reasoning"),
    ({"reasoning_content": "a", "reasoning": "b"}, "differ"),
])
def test_bad_reasoning_is_named(tok, fields, named):
    with pytest.raises(FieldError, match=re.escape(named)):
        render_chat(tok, loop(fields), CURRENT_TURN, None, {})


def test_both_fields_agreeing_and_null_are_taken(tok):
    both = render_chat(tok, loop({"reasoning_content": THOUGHT, "reasoning": THOUGHT}), CURRENT_TURN, None, {})[0]
    assert both == render_chat(tok, loop({"reasoning_content": THOUGHT}), CURRENT_TURN, None, {})[0]
    assert "<think>" not in render_chat(tok, loop({"reasoning_content": None}), CURRENT_TURN, None, {})[0]


def test_a_template_that_reads_thinking_gets_the_reasoning_there(tok):
    text = render_chat(tok, loop({"reasoning_content": THOUGHT}), HARMONY_RULE, None, {})[0]
    # the reasoning is the analysis; the turn's content (a preamble) gives way to it rather than a refusal
    assert f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant to=functions.lookup" in text
    assert "Looking it up." not in text
    plain = render_chat(tok, loop({}), HARMONY_RULE, None, {})[0]
    assert "analysis<|message|>Looking it up.<|end|>" in plain


def test_anthropic_thinking_blocks_become_the_turns_reasoning(tok):
    body = parse_messages_request({"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": THOUGHT, "signature": "sig"},
                                          {"type": "redacted_thinking", "data": "opaque"},
                                          {"type": "text", "text": "Looking it up."}]},
        {"role": "user", "content": "Go on."}]}).chat_body()
    assert body["messages"][1] == {"role": "assistant", "content": "Looking it up.", "reasoning_content": THOUGHT}
    text = render_chat(tok, body["messages"], EVERY_TURN, None, {})[0]
    assert f"<think>\n{THOUGHT}\n</think>\n\nLooking it up." in text and "opaque" not in text


def test_responses_reasoning_text_items_become_the_next_turns_reasoning():
    msgs = input_messages([
        {"type": "message", "role": "user", "content": "Capital of France?"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "the user "},
                                                         {"type": "reasoning_text", "text": "wants a city"}]},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "Paris"}])
    assert msgs[1]["role"] == "assistant" and msgs[1]["reasoning_content"] == THOUGHT
    with pytest.raises(FieldError, match=re.escape("input[0].content")):
        input_messages([{"type": "reasoning", "summary": [], "content": [{"type": "summary_text", "text": "x"}]}])


# DeepSeek R1's layout: the generation prompt opens the reasoning block, a turn shows its reasoning (the 135M
# model writes a blank line after the marker, which the parser strips: the turn's layout restores it)
R1_LAYOUT = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content is string %}<think>\n\n{{ m.reasoning_content }}</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--chat-template", R1_LAYOUT, "--reasoning-parser", "deepseek-r1", "--page-size", "1",
                        "--dtype", "float32", "--max-total-tokens", "4096")
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


def shared(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_a_turn_sent_back_with_its_reasoning_hits_the_prefix_cache(server):
    ask = [{"role": "user", "content": "Name a city in France."}]
    with httpx.Client(base_url=server.url, timeout=120) as client:
        prompt = client.post("/tokenize", json={"messages": ask}).json()["tokens"]
        first = client.post("/v1/chat/completions", json={
            "model": "default", "messages": ask, "temperature": 0, "max_tokens": 16, "logprobs": True,
            "return_tokens_as_token_ids": True}).json()
        reply = first["choices"][0]["message"]
        assert reply["reasoning_content"] and not reply["content"]  # cut off inside the block
        output = [int(t["token"].removeprefix("token_id:")) for t in first["choices"][0]["logprobs"]["content"]]
        assert len(prompt) == first["usage"]["prompt_tokens"] and len(output) == 16
        cached_kv = prompt + output[:-1]  # the last token written was never run through the model

        def turn_two(turn: dict) -> tuple[int, int]:
            """(tokens the cache serves, tokens shared with what the first request ran) for the next turn."""
            nxt = [*ask, turn, {"role": "user", "content": "Another one."}]
            ids = client.post("/tokenize", json={"messages": nxt}).json()["tokens"]
            r = client.post("/v1/chat/completions", json={"model": "default", "messages": nxt, "temperature": 0,
                                                          "max_tokens": 2})
            assert r.status_code == 200, r.text
            return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"], shared(ids, cached_kv)

        with_thought = turn_two({"role": "assistant", "content": "", "reasoning_content": reply["reasoning_content"]})
        without = turn_two({"role": "assistant", "content": ""})
        assert_idle_and_whole(client)
    # with its reasoning the turn renders as the model wrote it: the prompt and the written tokens come from the
    # cache; without, the prompt parts from what the model ran right after the block's marker
    assert with_thought[0] == with_thought[1] >= len(cached_kv) - 2, (with_thought, len(prompt))
    assert without[0] == without[1] < len(prompt), (without, len(prompt))
