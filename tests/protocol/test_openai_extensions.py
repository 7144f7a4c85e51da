"""vLLM's and SGLang's request fields on the OpenAI routes, without a server: how a chat prompt ends
(chat_render.turn_end: add_generation_prompt / continue_final_message, rendered with the embedded model's
template), Anthropic's final assistant turn as a prefill, vLLM's structured_outputs as the GrammarSpec the
native fields give, and choice_regex keeping every choice literal."""

from __future__ import annotations

import re

import pytest
from transformers import AutoTokenizer

from radixlang_runtime.constrained.spec import GrammarSpec, choice_regex, spec_from_structured_outputs
from radixlang_runtime.model.loader.resolve import resolve_model_dir
from radixlang_runtime.protocol.limits import FieldError
from radixlang_runtime.server.anthropic_records import parse_messages_request
from radixlang_runtime.server.chat_render import CONTINUE_FINAL, OPEN_TURN, TurnEnd, render_chat, turn_end
from radixlang_runtime.server.openai_reasoning import ReasoningPlan, reasoning_tokens
from radixlang_runtime.reasoning_parser import get_reasoning_parser

PREFILL = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi! My name"}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_model_dir(None))


def test_turn_end_defaults_and_conflicts():
    assert turn_end({}) == OPEN_TURN == TurnEnd(True, False)
    assert turn_end({"continue_final_message": True}) == CONTINUE_FINAL == TurnEnd(False, True)
    assert turn_end({"continue_final_message": True, "add_generation_prompt": False}) == CONTINUE_FINAL
    assert turn_end({"add_generation_prompt": False}) == TurnEnd(False, False)
    assert turn_end({"add_generation_prompt": None, "continue_final_message": None}) == OPEN_TURN
    with pytest.raises(FieldError, match="cannot both be true"):
        turn_end({"continue_final_message": True, "add_generation_prompt": True})
    with pytest.raises(FieldError) as e:
        turn_end({"add_generation_prompt": "no"})
    assert e.value.param == "add_generation_prompt"


def test_the_final_message_is_left_open(tok):
    closed = tok.apply_chat_template(PREFILL, tokenize=False)
    opened = tok.apply_chat_template(PREFILL, tokenize=False, add_generation_prompt=True)
    assert render_chat(tok, PREFILL, None)[0] == opened
    assert render_chat(tok, PREFILL, None, turn=TurnEnd(False, False))[0] == closed
    text = render_chat(tok, PREFILL, None, turn=CONTINUE_FINAL)[0]
    assert text.endswith("<|im_start|>assistant\nHi! My name") and closed.startswith(text)
    parts = [PREFILL[0], {"role": "assistant", "content": [{"type": "text", "text": "Hi! "},
                                                           {"type": "text", "text": "My name"}]}]
    assert render_chat(tok, parts, None, turn=CONTINUE_FINAL)[0] == text  # text parts joined first
    user_last = render_chat(tok, PREFILL[:1], None, turn=CONTINUE_FINAL)[0]
    assert user_last.endswith("<|im_start|>user\nSay hi")  # any role's text may be continued, as in vLLM
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    with pytest.raises(FieldError, match="holds tool calls"):
        render_chat(tok, [PREFILL[0], call], None, turn=CONTINUE_FINAL)
    drops = "{% for m in messages %}{{ m['role'] }}: {{ m['content'][:2] }}\n{% endfor %}"  # shows no final text
    with pytest.raises(FieldError, match="cannot be continued with this chat template") as e:
        render_chat(tok, PREFILL, drops, turn=CONTINUE_FINAL)
    assert e.value.param == "continue_final_message"


def test_anthropic_final_assistant_text_is_a_prefill():
    def req(messages):
        return parse_messages_request({"model": "m", "max_tokens": 4, "messages": messages})

    body = req(PREFILL).chat_body()
    assert body["continue_final_message"] is True and body["messages"][-1]["content"] == "Hi! My name"
    assert "continue_final_message" not in req(PREFILL[:1]).chat_body()
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}
    assert "continue_final_message" not in req([PREFILL[0], use]).chat_body()  # a call waits for its result
    blocks = {"role": "assistant", "content": [{"type": "text", "text": "Hi! "}, {"type": "text", "text": "My"}]}
    assert req([PREFILL[0], blocks]).chat_body()["messages"][-1]["content"] == "Hi! My"
    with pytest.raises(FieldError, match="final assistant content cannot end with trailing whitespace"):
        req([PREFILL[0], {"role": "assistant", "content": "Hi!\n"}])


def test_reasoning_after_a_prefill_is_counted_from_where_it_left_off():
    qwen3 = get_reasoning_parser("qwen3")
    out = "more thought\n</think>\n\nThe answer."
    words = out.split(" ")
    ids = list(range(len(words)))

    def decode(i):
        return " ".join(words[:len(i)])

    primed = ReasoningPlan(qwen3, prefix="<think>\nsome")
    assert reasoning_tokens(primed, ids, decode) == 2  # "more", "thought\n</think>\n\nThe"
    assert reasoning_tokens(ReasoningPlan(qwen3), ids, decode) == 0  # read alone: no reasoning opened
    split = primed.stream().feed(out, final=True)
    assert (split.reasoning, split.content) == ("more thought", "The answer.")


def test_structured_outputs_give_the_native_specs():
    assert spec_from_structured_outputs(None) is None
    assert spec_from_structured_outputs({"json": PERSON}) == GrammarSpec.from_json_schema(PERSON)
    assert spec_from_structured_outputs({"regex": "[0-9]+"}) == GrammarSpec.from_regex("[0-9]+")
    assert spec_from_structured_outputs({"grammar": 'root ::= "a"'}) == GrammarSpec.from_ebnf('root ::= "a"')
    assert spec_from_structured_outputs({"json_object": True}) == GrammarSpec.json_object()
    assert spec_from_structured_outputs({"choice": ["a", "b"]}) == GrammarSpec.from_regex("(?:a|b)")
    assert spec_from_structured_outputs({"choice": ["a"], "json_object": False, "disable_fallback": True,
                                         "disable_any_whitespace": False}) == GrammarSpec.from_regex("(?:a)")
    for bad, named in (({"choice": ["a"], "regex": "b"}, "exactly one"), ({}, "got none"),
                       ({"json_object": "yes"}, "json_object must be true"), ({"regex": 3}, "regex must be a string"),
                       ({"choice": "ab"}, "structured_outputs.choice"), ({"choice": ["a", ""]}, "non-empty"),
                       ({"choice": ["a"], "whitespace_pattern": " "}, "whitespace_pattern"),
                       ({"choice": ["a"], "disable_additional_properties": True}, "disable_additional_properties"),
                       ({"choice": ["a"], "backend": "x"}, "backend"), ([], "must be an object")):
        with pytest.raises(ValueError, match=named):
            spec_from_structured_outputs(bad)


@pytest.mark.parametrize("choices", [["yes", "no"], ["a.b|c", "a?b", "(x)", "[y]", "{z}", "^$", "\\d", "-~&#"],
                                     ["two words", "new\nline", "ünï ✓"], ["a", "ab", "abc"]])
def test_choice_regex_matches_each_choice_and_nothing_else(choices):
    rx = choice_regex(choices)
    for c in choices:
        assert re.fullmatch(rx, c), (rx, c)
    for other in ("", "x", choices[0] + "z", "y" + choices[-1], "\\d" if "\\d" not in choices else "5"):
        assert not re.fullmatch(rx, other), (rx, other)
    GrammarSpec.from_regex(rx)  # the runtime's own check takes it


def test_priority_is_taken_only_where_the_server_schedules_by_it():
    from radixlang_runtime.protocol.generate_input import parse_priority
    from radixlang_runtime.protocol.limits import RuntimeLimits

    on, off = RuntimeLimits(4096, 100, 4096, priority_scheduling=True), RuntimeLimits(4096, 100, 4096)
    assert parse_priority(None, off) == parse_priority(None, on) == 0
    assert parse_priority(-7, on) == -7
    with pytest.raises(FieldError, match="--enable-priority-scheduling"):
        parse_priority(1, off)
    for bad in ("1", 1.0, False, 2**31):
        with pytest.raises(FieldError) as e:
            parse_priority(bad, on)
        assert e.value.param == "priority"
