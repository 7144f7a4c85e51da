"""Constrained decoding end to end on the real model (Engine, fp32, greedy): outputs match their
grammar, jump-forward on and off give identical text with fewer forward passes, unconstrained
neighbours are untouched, forced tokens carry null logprobs, bad grammars are ValueErrors."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from conftest import PROMPTS, assert_whole

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
        "city": {"type": "string", "enum": ["Paris", "London", "Rome"]}},
        "required": ["name", "age", "city"], "additionalProperties": False},
    "tool_call": {"type": "object", "properties": {
        "name": {"type": "string", "enum": ["get_weather", "search"]},
        "arguments": {"type": "object", "properties": {"location": {"type": "string", "maxLength": 30},
                                                       "unit": {"type": "string", "enum": ["c", "f"]}},
                      "required": ["location", "unit"], "additionalProperties": False}},
        "required": ["name", "arguments"], "additionalProperties": False},
    "list": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                       "minItems": 1, "maxItems": 3}},
             "required": ["tags"], "additionalProperties": False},
}
REGEXES = {"year": r"(19|20)[0-9]{2}", "phone": r"[0-9]{3}-[0-9]{4}", "yes_no": r"(yes|no)"}


def chat(q: str) -> str:
    return f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"


def set_jump_forward(engine, on: bool) -> None:
    engine._loop.call(lambda s: setattr(s.grammar, "jump_forward", on))


@pytest.fixture
def jf_restored(engine):
    yield engine
    set_jump_forward(engine, True)


def run(engine, prompt: str, **constraint) -> dict:
    return engine.generate(prompt, {"temperature": 0, "max_new_tokens": 96, **constraint})


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_outputs_validate_and_jump_forward_keeps_the_text(jf_restored, name):
    engine, schema = jf_restored, SCHEMAS[name]
    prompt = chat(f"Reply with a JSON object ({name}) about a trip to Rome.")
    on = run(engine, prompt, json_schema=json.dumps(schema))
    set_jump_forward(engine, False)
    off = run(engine, prompt, json_schema=json.dumps(schema))
    assert on["text"] == off["text"] and on["output_ids"] == off["output_ids"]
    jsonschema.validate(json.loads(on["text"]), schema)
    m_on, m_off = on["meta_info"], off["meta_info"]
    assert m_on["forced_tokens"] > 0 and m_off["forced_tokens"] == 0
    assert m_on["forward_passes"] < m_off["forward_passes"]
    assert_whole(engine)


@pytest.mark.parametrize("name", sorted(REGEXES))
def test_regex_outputs_fully_match(engine, name):
    out = run(engine, chat("Answer in the requested format."), regex=REGEXES[name])
    assert re.fullmatch(REGEXES[name], out["text"]), out["text"]
    assert out["meta_info"]["finish_reason"]["type"] == "stop"


def test_mixed_batch_leaves_unconstrained_requests_alone(engine):
    sp = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    solo = [engine.generate(p, sp)["output_ids"] for p in PROMPTS[:3]]
    prompts = PROMPTS[:3] + [chat("Give a person as JSON.")] * 2
    sps = [sp] * 3 + [dict(sp, ignore_eos=False, json_schema=json.dumps(SCHEMAS["person"])),
                      dict(sp, ignore_eos=False, regex=REGEXES["phone"])]
    outs = engine.generate(prompts, sps)
    assert [o["output_ids"] for o in outs[:3]] == solo
    assert re.fullmatch(REGEXES["phone"], outs[4]["text"])


def test_streaming_and_logprobs_see_verified_draft_tokens_as_output(engine):
    schema = json.dumps(SCHEMAS["tool_call"])
    sp = {"temperature": 0, "max_new_tokens": 64, "json_schema": schema}
    full = engine.generate(chat("Call a tool for the weather in Oslo."), sp, return_logprob=True)
    chunks = list(engine.generate(chat("Call a tool for the weather in Oslo."), sp, stream=True))
    assert chunks[-1]["text"] == full["text"] and chunks[-1]["output_ids"] == full["output_ids"]
    entries = full["meta_info"]["output_token_logprobs"]
    assert len(entries) == len(full["output_ids"])
    forced = [e for e in entries if e[0] is None]
    assert len(forced) == full["meta_info"]["forced_tokens"] > 0
    assert all(e[0] <= 0 for e in entries if e[0] is not None)


@pytest.mark.parametrize("constraint,match", [
    ({"regex": "(a"}, "invalid regex"),
    ({"regex": "a{1000}{1000}"}, "too large"),
    ({"json_schema": json.dumps({"type": "number", "minimum": 3})}, "minimum"),
    ({"json_schema": "{not json"}, "json_schema"),
    ({"regex": "a", "json_schema": "{}"}, "at most one"),
])
def test_bad_grammars_are_value_errors(engine, constraint, match):
    with pytest.raises(ValueError, match=match):
        engine.generate("x", {"max_new_tokens": 4, **constraint})
    assert engine.generate("ok", {"max_new_tokens": 1})["meta_info"]["completion_tokens"] == 1
