"""Qwen3-Coder tool calls: XML, one `<tool_call>` block a call, text around them is content:
  <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>
A value is text (one newline on each side is layout); it becomes the JSON value the tool's parameters
schema types it as (markup.typed_value). A call's arguments stream one parameter at a time (a call commits
at its first complete parameter, or at `</function>`). A forced tool_choice writes that layout (SYNTAX: the
template's, calls one block each on their own lines) with the schema's properties in order, a string
parameter's value as text without `<`, others as JSON (server/openai_tools.forced_call_regex). No torch."""

from __future__ import annotations

from typing import Optional

from radixlang_runtime.tool_parsers.base import INVALID, OPEN, CallScan, CallSyntax, GroupScan, ToolParser, closing
from radixlang_runtime.tool_parsers.json_scan import COMPLETE, skip_ws
from radixlang_runtime.tool_parsers.markup import XML_KEY, arguments_json, expect, known, param_schema, \
    read_until, typed_value

START, END = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAM, PARAM_END = "<parameter=", "</parameter>"
NO_LIMIT = 1 << 60
SYNTAX = CallSyntax("", "\n", "", START + "\n" + FUNCTION, ">\n", FUNCTION_END + "\n" + END, args="xml",
                    param=(PARAM, ">\n", "\n" + PARAM_END + "\n"))


def _strip_layout(raw: str) -> str:
    raw = raw[1:] if raw.startswith("\n") else raw
    return raw[:-1] if raw.endswith("\n") else raw


def xml_params(parser: ToolParser, text: str, p: int, final: bool, name: str, calls: list[CallScan],
               tags: tuple[str, str, str, str, str], close_optional: bool = False) -> tuple[str, int]:
    """Parameters `OPEN KEY KEY_END VALUE VALUE_END` from text[p] up to the function's close tag
    (tags: open, key end, value open or "", value end, close) -> (COMPLETE, one past the close) / (OPEN, len) /
    (INVALID, index); the call is appended at its first complete parameter (streaming) or its close
    (close_optional: or the very end of the output). The parameters read are kept (the parser's scanner
    cache, by position) and the next delta resumes after them: a streamed group costs linear time."""
    state = parser._scanners.setdefault(("xml", p), [p, set(), []])  # resumed: [position, keys, pieces]
    p, keys, pieces = state  # pieces: `"key": value` JSON per parameter read

    def commit(status: str, at: int, complete: bool = False) -> tuple[str, int]:
        if complete or (pieces and not final):
            calls.append(CallScan(name, "{" + ", ".join(pieces) + ("}" if complete else ""), complete))
        return status, at

    while True:
        p = skip_ws(text, p)
        st_close, e = expect(text, p, tags[4], final)
        if st_close != COMPLETE and close_optional and final and p == len(text):
            st_close, e = COMPLETE, p
        if st_close == COMPLETE:
            return commit(COMPLETE, e, complete=True)
        st, end, hit = _xml_param(parser, text, p, final, name, tags)
        if hit is None:
            return commit(OPEN, len(text)) if OPEN in (st, st_close) else (INVALID, end)
        key, piece, p = hit
        if key in keys:
            return INVALID, p
        keys.add(key)
        pieces.append(piece)
        state[0] = p


def _xml_param(parser: ToolParser, text: str, p: int, final: bool, name: str,
               tags: tuple[str, str, str, str, str]) -> tuple[str, int, Optional[tuple[str, str, int]]]:
    """One parameter at text[p] -> (status, index, (key, its `"key": value` JSON, one past it) once complete)."""
    p_open, key_end, v_open, v_end, _ = tags
    st, e = expect(text, p, p_open, final)
    if st != COMPLETE:
        return st, e, None
    st, q = read_until(text, e, key_end, final)
    key = text[e:q].strip()
    if st != COMPLETE or not XML_KEY.fullmatch(key):
        return (st, q, None) if st == OPEN else (INVALID, e, None)
    q += len(key_end)
    if v_open:
        st, q = expect(text, skip_ws(text, q), v_open, final)
        if st != COMPLETE:
            return st, q, None
    st, r = read_until(text, q, v_end, final, NO_LIMIT)
    if st != COMPLETE:
        return st, r, None
    raw = text[q:r] if v_open else _strip_layout(text[q:r])
    value = typed_value(raw, param_schema(parser, name, key))
    return COMPLETE, r, (key, arguments_json([(key, value)], True)[1:-1], r + len(v_end))


class Qwen3CoderParser(ToolParser):
    name = "qwen3_coder"
    markers = (START,)
    syntax = SYNTAX

    def parse_group(self, text: str, final: bool) -> GroupScan:
        calls: list[CallScan] = []
        st, j = expect(text, skip_ws(text, len(START)), FUNCTION, final)
        if st != COMPLETE:
            return GroupScan(calls, st, j)
        st, k = read_until(text, j, ">", final)
        name = text[j:k].strip()
        if st == OPEN:
            return GroupScan(calls, OPEN, k)
        if st != COMPLETE or not XML_KEY.fullmatch(name) or not known(self, name):
            return GroupScan(calls, INVALID, j)
        st, end = xml_params(self, text, k + 1, final, name, calls, (PARAM, ">", "", PARAM_END, FUNCTION_END))
        if st != COMPLETE:
            return GroupScan(calls, st, end)
        return closing(text, end, END, final, calls)
