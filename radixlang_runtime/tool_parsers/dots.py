"""dots (rednote-hilab) tool calls: MiniMax-M2's `<invoke>` calls in a `<dots_function_call>` group, text around
the groups is content:
  <dots_function_call>\\n<invoke name="NAME">\\n<parameter name="KEY">VALUE</parameter>\\n</invoke>\\n
  ...</dots_function_call>
A group holds one or more calls; groups may follow one another. A group's body may instead be one JSON object
`{"name": ..., "arguments" | "parameters": {...}}` (SGLang's and vLLM's dots readings). A value's surrounding
whitespace is layout; the rest reads by the type its schema gives the parameter (dots_value, as both peers read
it). The close tag may be missing at the very end. A forced tool_choice writes the `<invoke>` layout with the
schema's properties in order, a string parameter's value as text without `<`, others as JSON. No torch."""

from __future__ import annotations

import json
import math
from typing import Any, Optional

from radixlang_runtime.tool_parsers.base import CallScan, CallSyntax, GroupScan, ToolParser, call_object_at, closing
from radixlang_runtime.tool_parsers.invoke import NAME_END, Invokes, parse_invokes
from radixlang_runtime.tool_parsers.json_scan import COMPLETE, skip_ws
from radixlang_runtime.tool_parsers.markup import param_schema, read_json
from radixlang_runtime.tool_parsers.qwen3_coder import ParamFields

START, END = "<dots_function_call>", "</dots_function_call>"
INVOKE, INVOKE_END, PARAM, PARAM_END = '<invoke name="', "</invoke>", '<parameter name="', "</parameter>"
_TEXT, _INTEGER, _NUMBER, _BOOLEAN = ("string", "str", "text"), ("integer", "int"), ("number", "float"), \
    ("boolean", "bool")
_MAX_DEPTH = 10  # $ref / anyOf nesting followed before a parameter counts as untyped


def schema_type(schema: Any, defs: dict, depth: int = 0) -> Optional[str]:
    """A parameter schema's type: its "type" (of a list, the first that is not "null"), else that of the local
    `#/$defs/` schema its $ref names, else that of its first anyOf / oneOf / allOf branch with one (null
    branches skipped); None: untyped."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None
    if "type" in schema:
        kind = schema["type"]
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        return kind.lower() if isinstance(kind, str) else None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return schema_type(defs.get(ref.rsplit("/", 1)[-1]), defs, depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        for branch in branches if isinstance(branches, list) else []:
            if isinstance(branch, dict) and branch.get("type") == "null":
                continue
            kind = schema_type(branch, defs, depth + 1)
            if kind is not None:
                return kind
    return None


def dots_value(raw: str, schema: Optional[dict], defs: dict) -> Any:
    """A parameter's text (whitespace around it is layout) -> its value: `null` (any case) is None; then by the
    schema's type: text types stay text; an integer / number / boolean reads as one (a whole number as an
    integer; booleans from true / 1 / false / 0) or stays text; other types read as JSON or stay text. Untyped:
    an enum member written as text or as JSON is that member, anything else the text."""
    value = raw.strip()
    if value.lower() == "null":
        return None
    kind = schema_type(schema, defs)
    if kind is None:
        enum = schema.get("enum") if isinstance(schema, dict) else None
        parsed = read_json(value)
        if isinstance(enum, list) and parsed is not ValueError and _member(parsed, enum) and not _member(value, enum):
            return parsed
        return value
    if kind in _TEXT:
        return value
    if kind in _INTEGER:
        try:
            return int(value)
        except ValueError:
            return value
    if kind in _NUMBER:
        return _number(value)
    if kind in _BOOLEAN:
        flag = value.lower()
        return True if flag in ("true", "1") else False if flag in ("false", "0") else value
    parsed = read_json(value)
    return value if parsed is ValueError else parsed


def _number(value: str) -> Any:
    """A number's text -> the number (a whole one an integer): JSON's (one too large for a float is infinite, as
    the typed XML formats read it), else what float() reads that is finite (`.5`, `+1`); else the text."""
    number = read_json(value)
    if not isinstance(number, (int, float)) or isinstance(number, bool):
        try:
            number = float(value)
        except ValueError:
            return value
        if not math.isfinite(number):
            return value
    return int(number) if isinstance(number, float) and number.is_integer() else number


def _member(value: Any, enum: list) -> bool:
    """value is one of enum's members (compared as JSON: 1 is not true)."""
    return any(json.dumps(value, sort_keys=True) == json.dumps(v, sort_keys=True) for v in enum)


class DotsFields(ParamFields):
    def value(self, parser: ToolParser, name: str, key: str, flag: str, raw: str) -> Any:
        defs = (parser.schemas.get(name) or {}).get("$defs")
        return dots_value(raw, param_schema(parser, name, key), defs if isinstance(defs, dict) else {})


class DotsParser(ToolParser):
    name = "dots"
    markers = (START,)
    invokes = Invokes(START, END, INVOKE, INVOKE_END, PARAM, PARAM_END)
    syntax = CallSyntax(START + "\n", "", END, INVOKE, NAME_END + "\n", INVOKE_END + "\n", args="xml",
                        param=(PARAM, NAME_END, PARAM_END + "\n"))
    fields = DotsFields()

    def parse_group(self, text: str, final: bool) -> GroupScan:
        i = skip_ws(text, len(START))
        if not text.startswith("{", i):
            return parse_invokes(self, self.invokes, self.fields, text, final)
        calls: list[CallScan] = []  # the JSON body: one call object
        status, end = call_object_at(text, i, final, self.tool_names, calls, self.scan_at)
        return closing(text, end, END, final, calls) if status == COMPLETE else GroupScan(calls, status, end)
