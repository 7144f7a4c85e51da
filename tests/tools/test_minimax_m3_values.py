"""MiniMax-M3's parameter values: text read by the parameter's schema "type" as SGLang's minimax_m3 parser reads
it, nested tags as objects and arrays, and the markup it refuses (test_tool_formats.py holds the recorded
outputs, the streaming checks and the round trip)."""

from __future__ import annotations

import json

import pytest

from radixlang_runtime.tool_parsers import CallStart, collect, get_parser

NS = "]<]minimax[>["


def tag(key: str, body: str) -> str:
    return f"{NS}<{key}>{body}{NS}</{key}>"


def group(*invokes: str) -> str:
    return f"{NS}<tool_call>\n" + "".join(f'{NS}<invoke name="f">{body}{NS}</invoke>\n' for body in invokes) \
        + f"{NS}</tool_call>"


def stream(text: str, schemas: dict) -> list:
    p = get_parser("minimax-m3")(None, schemas=schemas)
    events = []
    for ch in text:
        events += p.feed(ch)
    return events + p.finish()


SCHEMA = {"type": "object", "properties": {
    "s": {"type": "string"}, "ns": {"type": ["string", "null"]}, "i": {"type": "integer"}, "n": {"type": "number"},
    "b": {"type": "boolean"}, "u": {"type": ["integer", "null"]},
    "a": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "integer"}}}},
    "t": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
    "o": {"type": "object", "properties": {"when": {"type": "string"}}, "additionalProperties": {"type": "boolean"}},
    "e": {"type": "array"}}}


def test_values_follow_the_schema_types_as_sglang_reads_them():
    """A string as written (spaces and `null` too); null / NULL / nothing is None where null is allowed; an
    integer, a number (whole: an integer; 1e999 is not one), a boolean (yes / on / 0); text that reads as
    none of its types stays text; no schema: text; an empty body with no scalar type: an empty array or
    object."""
    values = [("s", " 42 ", " 42 "), ("s", "null", "null"), ("ns", "NULL", None), ("ns", "", None), ("i", "7", 7),
              ("i", "seven", "seven"), ("n", "2.0", 2), ("n", "-1.5", -1.5), ("n", "1e999", "1e999"),
              ("b", "on", True), ("b", "0", False), ("b", "maybe", "maybe"), ("u", "Null", None),
              ("x", "[1, 2]", "[1, 2]"), ("e", "", []), ("x", "", {})]
    text = group(*(tag(k, raw) for k, raw, _ in values))
    got = get_parser("minimax-m3").parse(text, schemas={"f": SCHEMA})
    assert [(c.name, json.loads(c.arguments)) for c in got.calls] == [("f", {k: v}) for k, _, v in values]
    assert collect(stream(text, {"f": SCHEMA})).calls[-1].arguments == got.calls[-1].arguments


def test_nested_tags_are_objects_and_arrays_by_the_schema():
    """`<item>` tags under an array schema are its elements (each typed by items / prefixItems); other nested
    tags are an object's members (additionalProperties types the undeclared ones); a key written twice
    inside an object is the list of its values; whitespace between tags is layout."""
    body = (tag("a", "\n" + tag("item", tag("k", "1")) + "\n" + tag("item", tag("k", "2")) + "\n")
            + tag("t", tag("item", "x") + tag("item", "3"))
            + tag("o", tag("when", "now") + tag("fast", "yes") + tag("fast", "no"))
            + tag("z", tag("item", "1") + tag("item", "2")))
    got = get_parser("minimax-m3").parse(group(body), schemas={"f": SCHEMA})
    assert json.loads(got.calls[0].arguments) == {"a": [{"k": 1}, {"k": 2}], "t": ["x", 3],
                                                  "o": {"when": "now", "fast": [True, False]},
                                                  "z": {"item": ["1", "2"]}}  # no schema: an object, text leaves


def test_a_parameter_written_twice_is_not_a_call():
    """parse() sees the repeat and leaves the group as text; a stream has sent the call at its first parameter
    (the documented limit of every format that streams parameters)."""
    text = group(tag("s", "a") + tag("s", "b"))
    got = get_parser("minimax-m3").parse(text, schemas={"f": SCHEMA})
    assert got.calls == [] and got.content == text
    assert [e.name for e in stream(text, {"f": SCHEMA}) if isinstance(e, CallStart)] == ["f"]


@pytest.mark.parametrize("depth,calls", [(32, 1), (33, 0)])
def test_nesting_deeper_than_the_limit_is_not_a_call(depth, calls):
    body = "1"
    for _ in range(depth):
        body = tag("x", body)
    got = get_parser("minimax-m3").parse(group(body))
    assert len(got.calls) == calls
    if not calls:
        assert got.content == group(body)


def test_a_forced_tool_choice_is_refused_with_a_clear_error():
    from radixlang_runtime.protocol.limits import FieldError
    from radixlang_runtime.server.openai_tools import check_tools, forced_call_regex, with_parser

    plan = with_parser(check_tools({"tools": [{"type": "function", "function": {"name": "f"}}],
                                    "tool_choice": "required"}), "minimax-m3", None)
    with pytest.raises(FieldError, match="not supported with the minimax-m3 tool-call format"):
        forced_call_regex(plan, False)
