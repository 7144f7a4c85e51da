"""MiniMax-M3 tool calls: every tag follows the namespace token `]<]minimax[>[` (whitespace may sit between the
two), one `tool_call` group holds the calls, a parameter is a tag named by its key, text around the group is
content:
  NS<tool_call>\\nNS<invoke name="NAME">NS<KEY>VALUE NS</KEY>...NS</invoke>\\n...NS</tool_call>
A value is text, or nested tags: an object's members by key, an array's elements as `<item>` tags (the
shape SGLang's and vLLM's minimax_m3 parsers read and their renderer writes). Values read as SGLang reads
them, by the schema's "type": a string as written; null / Null / NULL or nothing, where null is allowed,
None; then an integer, a number (whole: an integer), a boolean (true / 1 / yes / on, false / 0 / no / off);
else the text. An empty body with no scalar type is an empty array or object. Nested tags are an array
where the schema allows one and the first is `<item>`, else an object (a key written twice: the list of
its values). A call's arguments stream one parameter at a time; a parameter written twice is not a call.
The close tag may be missing at the very end. The layout has no CallSyntax (a parameter's close tag
repeats its key), so tool_choice cannot force it. No torch."""

from __future__ import annotations

import math
import re
from typing import Any, Optional

from radixlang_runtime.tool_parsers.base import DONE, INVALID, OPEN, CallScan, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.json_scan import COMPLETE, skip_ws
from radixlang_runtime.tool_parsers.markup import arguments_json, expect, known, param_schema, read_until
from radixlang_runtime.tool_parsers.qwen3_coder import NO_LIMIT

NS = "]<]minimax[>["
GROUP, GROUP_END, INVOKE_END, ITEM = "tool_call", "/tool_call", "/invoke", "item"
MAX_DEPTH = 32  # a parameter's tags nested deeper than this (its own tag counts) are not a call
_INVOKE = re.compile(r'invoke name="([^\s<>"]+)"')
_KEY = re.compile(r"[^\s<>/][^\s<>]*")
_NULLS = ("null", "Null", "NULL", "")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
_SCALARS = {"string", "str", "integer", "int", "number", "float", "boolean", "bool", "null"}


def tag_at(text: str, i: int, final: bool) -> tuple[str, str, int]:
    """A tag `NS <INNER>` at text[i] -> (COMPLETE, INNER, one past `>`) / (OPEN, "", len) / (INVALID, "", i)."""
    st, j = expect(text, i, NS, final)
    if st != COMPLETE:
        return st, "", j
    j = skip_ws(text, j)
    st, j = expect(text, j, "<", final)
    if st != COMPLETE:
        return st, "", j
    st, k = read_until(text, j, ">", final)
    if st != COMPLETE:
        return st, "", k
    return COMPLETE, text[j:k], k + 1


def _types(schema: Any) -> set[str]:
    kind = schema.get("type") if isinstance(schema, dict) else None
    kinds = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else []
    return {k.lower() for k in kinds if isinstance(k, str)}


def leaf_value(raw: str, schema: Any) -> Any:
    """A value's text -> its JSON value by the schema's "type" (the module docstring's order)."""
    kinds = _types(schema)
    if kinds & {"string", "str"} and "null" not in kinds:
        return raw
    if "null" in kinds and raw in _NULLS:
        return None
    if kinds & {"integer", "int"}:
        try:
            return int(raw)
        except ValueError:
            pass
    if kinds & {"number", "float"}:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return int(value) if value.is_integer() else value
    if kinds & {"boolean", "bool"} and raw.strip().lower() in _TRUE + _FALSE:
        return raw.strip().lower() in _TRUE
    return raw


def child_schema(schema: Any, tag: str, index: int) -> Optional[dict]:
    """The schema of a nested tag: an array's element number `index` (tag `item`), else an object's member."""
    if not isinstance(schema, dict):
        return None
    if "array" in _types(schema) and tag == ITEM:
        prefix = schema.get("prefixItems")
        if isinstance(prefix, list) and index < len(prefix):
            found = prefix[index]
        else:
            found = schema.get("items")
    else:
        props = schema.get("properties")
        found = props.get(tag) if isinstance(props, dict) and tag in props else schema.get("additionalProperties")
    return found if isinstance(found, dict) else None


def _container(children: list[tuple[str, Any]], schema: Any) -> Any:
    if "array" in _types(schema) and (not children or children[0][0] == ITEM):
        return [v for _, v in children]
    out: dict[str, Any] = {}
    for tag, v in children:
        if tag not in out:
            out[tag] = v
        elif isinstance(out[tag], list):
            out[tag].append(v)
        else:
            out[tag] = [out[tag], v]
    return out


def read_node(text: str, q: int, final: bool, tag: str, schema: Any, depth: int = 0) -> tuple[str, Any, int]:
    """The body of `NS<tag>` from text[q] up to its `NS</tag>` -> (COMPLETE, value, one past the close) /
    (OPEN, None, len) / (INVALID, None, index). depth: the tags open around this one."""
    if depth >= MAX_DEPTH:
        return INVALID, None, q
    st, r = read_until(text, q, NS, final, NO_LIMIT)
    if st != COMPLETE:
        return st, None, r
    lead = text[q:r]
    st, inner, e = tag_at(text, r, final)
    if st != COMPLETE:
        return st, None, e
    if inner == "/" + tag:
        kinds = _types(schema)
        if lead or (kinds & _SCALARS and not kinds & {"object", "array"}):
            return COMPLETE, leaf_value(lead, schema), e
        return COMPLETE, [] if "array" in kinds else {}, e
    if lead.strip():
        return INVALID, None, r  # text beside nested tags
    children: list[tuple[str, Any]] = []
    while True:
        if not _KEY.fullmatch(inner):
            return INVALID, None, r
        st, value, e = read_node(text, e, final, inner, child_schema(schema, inner, len(children)), depth + 1)
        if st != COMPLETE:
            return st, None, e
        children.append((inner, value))
        r = skip_ws(text, e)
        st, inner, e = tag_at(text, r, final)
        if st != COMPLETE:
            return st, None, e
        if inner == "/" + tag:
            return COMPLETE, _container(children, schema), e


def _params(parser: ToolParser, text: str, p: int, final: bool, name: str, calls: list[CallScan]) -> tuple[str, int]:
    """A call's parameters from text[p] up to `NS</invoke>` -> (COMPLETE, one past it) / (OPEN, len) /
    (INVALID, index); the call is appended at its first complete parameter (streaming) or its close. The
    parameters read are kept (the parser's scanner cache, by position): the next delta resumes after them."""
    state = parser._scanners.setdefault(("m3", p), [p, set(), []])  # [position, keys, `"key": value` pieces]
    p, keys, pieces = state

    def commit(status: str, at: int, complete: bool = False) -> tuple[str, int]:
        if complete or (pieces and not final):
            calls.append(CallScan(name, "{" + ", ".join(pieces) + ("}" if complete else ""), complete))
        return status, at

    while True:
        p = skip_ws(text, p)
        st, key, q = tag_at(text, p, final)
        if st == OPEN:
            return commit(OPEN, len(text))
        if st != COMPLETE:
            return INVALID, q
        if key == INVOKE_END:
            return commit(COMPLETE, q, complete=True)
        if not _KEY.fullmatch(key) or key in keys:
            return INVALID, p
        st, value, end = read_node(text, q, final, key, param_schema(parser, name, key))
        if st == OPEN:
            return commit(OPEN, len(text))
        if st != COMPLETE:
            return INVALID, end
        keys.add(key)
        pieces.append(arguments_json([(key, value)], True)[1:-1])
        p = state[0] = end


class MiniMaxM3Parser(ToolParser):
    name = "minimax-m3"
    markers = (NS,)
    keeps_special_tokens = True
    syntax = None

    def parse_group(self, text: str, final: bool) -> GroupScan:
        state = self._scanners.get(("m3-group", 0))  # [resume index, complete calls]
        if state is None:
            st, inner, i = tag_at(text, 0, final)
            if st != COMPLETE or inner != GROUP:
                return GroupScan([], INVALID if st == COMPLETE else st, i)
            state = self._scanners[("m3-group", 0)] = [i, []]
        i, calls = state[0], list(state[1])
        while True:
            i = skip_ws(text, i)
            if calls and i == len(text):
                return GroupScan(calls, DONE if final else OPEN, i)
            st, inner, j = tag_at(text, i, final)
            if st != COMPLETE:
                return GroupScan(calls, st, j)
            if inner == GROUP_END and calls:
                return GroupScan(calls, DONE, j)
            m = _INVOKE.fullmatch(inner)
            if m is None or not known(self, m.group(1)):
                return GroupScan(calls, INVALID, i)
            st, end = _params(self, text, j, final, m.group(1), calls)
            if st != COMPLETE:
                return GroupScan(calls, st, end)
            i = state[0] = end
            state[1] = list(calls)

