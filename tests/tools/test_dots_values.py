"""dots' parameter values: read by the type the tool's schema gives them, as SGLang's and vLLM's dots parsers read
them (whitespace around a value is layout, `null` is None, $ref / anyOf followed)."""

from __future__ import annotations

import json

from radixlang_runtime.tool_parsers import get_parser


def calls_of(result) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in result.calls]


def test_dots_values_follow_the_schema_as_its_peers_read_them():
    """dots: whitespace around a value is layout; `null` (any case) is None; the type is the schema's (a list's first
    non-null one, a local $ref's, an anyOf branch's); integers / numbers / booleans that do not read stay text, a
    whole number is an integer; other types read as JSON; untyped: text, but for an enum member written as JSON."""
    schema = {"type": "object", "$defs": {"Spot": {"type": "object"}}, "properties": {
        "n": {"type": "number"}, "i": {"type": ["null", "integer"]}, "b": {"type": "boolean"},
        "e": {"enum": ["c", 1, None]}, "r": {"$ref": "#/$defs/Spot"}, "s": {"type": "string"},
        "a": {"anyOf": [{"type": "null"}, {"type": "array"}]}, "u": {"description": "untyped"}}}
    values = [("n", " 2.0 ", 2), ("n", "-1.5", -1.5), ("n", "inf", "inf"), ("n", "+.5", 0.5), ("i", "7", 7),
              ("i", "seven", "seven"),
              ("b", "True", True), ("b", "0", False), ("b", "yes", "yes"), ("e", "c", "c"), ("e", '"c"', "c"),
              ("e", "1", 1), ("e", "Null", None), ("r", '{"k": [1]}', {"k": [1]}), ("r", "{bad", "{bad"),
              ("s", "\n 42 \n", "42"), ("a", "[1, 2]", [1, 2]), ("u", "[1, 2]", "[1, 2]"), ("x", " 3 ", "3")]
    text = "".join(f'<dots_function_call><invoke name="f"><parameter name="{k}">{raw}</parameter></invoke>'
                   "</dots_function_call>" for k, raw, _ in values)
    got = get_parser("dots").parse(text, schemas={"f": schema})
    assert calls_of(got) == [("f", {k: v}) for k, _, v in values]
