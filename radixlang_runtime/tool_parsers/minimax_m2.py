"""MiniMax-M2 tool calls: one `<minimax:tool_call>` group holds the calls, text around it is content:
  <minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="KEY">VALUE</parameter>\\n...</invoke>\\n
  ...</minimax:tool_call>
A value is text (newlines on each side are layout) read by the parameter's schema the way SGLang's
minimax-m2 parser reads it (minimax_value). A forced tool_choice writes the chat template's layout with the
schema's properties in order, a string parameter's value as text without `<`, others as JSON. No torch."""

from __future__ import annotations

import json
import math
from typing import Any, Optional

from radixlang_runtime.tool_parsers.base import CallSyntax, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.invoke import NAME_END, Invokes, parse_invokes
from radixlang_runtime.tool_parsers.markup import param_schema, read_json
from radixlang_runtime.tool_parsers.qwen3_coder import ParamFields

START, END = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE, INVOKE_END, PARAM, PARAM_END = '<invoke name="', "</invoke>", '<parameter name="', "</parameter>"
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def schema_types(schema: Any) -> set[str]:
    """The JSON types a parameter's schema allows: its "type", its enum values' types, and those of its
    anyOf / oneOf / allOf branches (none found: string)."""
    found: set[str] = set()

    def visit(node: Any) -> None:
        if not isinstance(node, dict):
            return
        kind = node.get("type")
        found.update(k for k in ([kind] if isinstance(kind, str) else kind or []) if isinstance(k, str))
        for v in node.get("enum") or []:
            found.add(_json_type(v))
        for key in ("anyOf", "oneOf", "allOf"):
            for branch in node.get(key) or []:
                visit(branch)

    visit(schema)
    return found or {"string"}


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    return {int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(type(v), "string")


def minimax_value(raw: str, schema: Optional[dict]) -> Any:
    """A parameter's text -> its value: `null` is None; an enum's member written as text or as JSON is that
    member; else the first of integer, number, boolean, object, array, string the schema allows that the text
    reads as (a number with no fraction is an integer); else JSON, else the text."""
    if raw.lower() == "null":
        return None
    enum = schema.get("enum") if isinstance(schema, dict) else None
    if isinstance(enum, list):
        members = {json.dumps(v, sort_keys=True): v for v in enum}
        for candidate in (read_json(raw), raw):
            if candidate is not ValueError and json.dumps(candidate, sort_keys=True) in members:
                return candidate
    types = schema_types(schema)
    for kind in ("integer", "number", "boolean", "object", "array", "string"):
        if kind not in types:
            continue
        if kind == "string":
            return raw
        if kind == "integer":
            try:
                return int(raw)
            except ValueError:
                continue
        if kind == "number":
            try:
                value = float(raw)
            except ValueError:
                continue
            if math.isfinite(value):
                return int(value) if value.is_integer() else value
        if kind == "boolean" and raw.strip().lower() in _TRUE + _FALSE:
            return raw.strip().lower() in _TRUE
        if kind in ("object", "array") and isinstance(read_json(raw), dict if kind == "object" else list):
            return read_json(raw)
    value = read_json(raw)
    return raw if value is ValueError else value


class MiniMaxFields(ParamFields):
    def value(self, parser: ToolParser, name: str, key: str, flag: str, raw: str) -> Any:
        return minimax_value(raw.strip("\n"), param_schema(parser, name, key))


class MiniMaxM2Parser(ToolParser):
    name = "minimax-m2"
    markers = (START,)
    keeps_special_tokens = True  # <minimax:tool_call> is a special token of MiniMax-M2's tokenizer
    invokes = Invokes(START, END, INVOKE, INVOKE_END, PARAM, PARAM_END)
    syntax = CallSyntax(START + "\n", "", END, INVOKE, NAME_END + "\n", INVOKE_END + "\n", args="xml",
                        param=(PARAM, NAME_END, PARAM_END + "\n"))
    fields = MiniMaxFields()

    def parse_group(self, text: str, final: bool) -> GroupScan:
        return parse_invokes(self, self.invokes, self.fields, text, final)
