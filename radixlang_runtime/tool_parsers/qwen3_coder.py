"""Qwen3-Coder tool calls: XML, one `<tool_call>` block a call, text around them is content:
  <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>
Seed-OSS writes the same calls in `<seed:tool_call>` blocks, a value inline (`<parameter=KEY>VALUE</parameter>`).
A value is text (one newline on each side is layout); it becomes the JSON value the tool's parameters
schema types it as (markup.typed_value). A call's arguments stream one parameter at a time (a call commits
at its first complete parameter, or at `</function>`). A forced tool_choice writes that layout (SYNTAX: the
template's, calls one block each on their own lines) with the schema's properties in order, a string
parameter's value as text without `<`, others as JSON (server/openai_tools.forced_call_regex). No torch."""

from __future__ import annotations

from typing import Any, Optional

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


class ParamFields:
    """How a parameter's key text and value text read (the XML formats differ only here): key(text) ->
    (key, a flag the markup gives with it) or None (not a key); value(...) -> its JSON value."""

    def key(self, text: str) -> Optional[tuple[str, str]]:
        key = text.strip()
        return (key, "") if XML_KEY.fullmatch(key) else None

    def value(self, parser: ToolParser, name: str, key: str, flag: str, raw: str) -> Any:
        return typed_value(raw, param_schema(parser, name, key))

    def layout(self, raw: str) -> str:
        """A value's text as written -> the value's text (one newline on each side is layout)."""
        return _strip_layout(raw)

    def call_name(self, header: str) -> Optional[str]:
        """A call header's text (formats whose header is attributes, Invokes.header_end) -> its name or None."""
        return None


TYPED = ParamFields()  # keys as they are, values typed by the schema (markup.typed_value)


def _strip_layout(raw: str) -> str:
    raw = raw[1:] if raw.startswith("\n") else raw
    return raw[:-1] if raw.endswith("\n") else raw


def xml_params(parser: ToolParser, text: str, p: int, final: bool, name: str, calls: list[CallScan],
               tags: tuple[str, str, str, str, str], close_optional: bool = False,
               fields: ParamFields = TYPED) -> tuple[str, int]:
    """Parameters `OPEN KEY KEY_END VALUE VALUE_END` from text[p] up to the function's close tag
    (tags: open, key end, value open or "", value end, close; fields: how a key and a value read) ->
    (COMPLETE, one past the close) / (OPEN, len) / (INVALID, index); the call is appended at its first
    complete parameter (streaming) or its close (close_optional: or the very end of the output). The
    parameters read are kept (the parser's scanner cache, by position) and the next delta resumes after them:
    a streamed group costs linear time."""
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
        st, end, hit = _xml_param(parser, text, p, final, name, tags, fields)
        if hit is None:
            return commit(OPEN, len(text)) if OPEN in (st, st_close) else (INVALID, end)
        key, piece, p = hit
        if key in keys:
            return INVALID, p
        keys.add(key)
        pieces.append(piece)
        state[0] = p


def _xml_param(parser: ToolParser, text: str, p: int, final: bool, name: str,
               tags: tuple[str, str, str, str, str],
               fields: ParamFields) -> tuple[str, int, Optional[tuple[str, str, int]]]:
    """One parameter at text[p] -> (status, index, (key, its `"key": value` JSON, one past it) once complete)."""
    p_open, key_end, v_open, v_end, _ = tags
    st, e = expect(text, p, p_open, final)
    if st != COMPLETE:
        return st, e, None
    st, q = read_until(text, e, key_end, final)
    read = fields.key(text[e:q]) if st == COMPLETE else None
    if read is None:
        return (st, q, None) if st == OPEN else (INVALID, e, None)
    key, flag = read
    q += len(key_end)
    if v_open:
        st, q = expect(text, skip_ws(text, q), v_open, final)
        if st != COMPLETE:
            return st, q, None
    st, r = read_until(text, q, v_end, final, NO_LIMIT)
    if st != COMPLETE:
        return st, r, None
    raw = text[q:r] if v_open else fields.layout(text[q:r])
    value = fields.value(parser, name, key, flag, raw)
    return COMPLETE, r, (key, arguments_json([(key, value)], True)[1:-1], r + len(v_end))


class Qwen3CoderParser(ToolParser):
    name = "qwen3_coder"
    start, end = START, END  # a call's block
    markers = (START,)
    syntax = SYNTAX

    def parse_group(self, text: str, final: bool) -> GroupScan:
        calls: list[CallScan] = []
        st, j = expect(text, skip_ws(text, len(self.start)), FUNCTION, final)
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
        return closing(text, end, self.end, final, calls)


class SeedOssParser(Qwen3CoderParser):
    """Seed-OSS: Qwen3-Coder's calls in `<seed:tool_call>` blocks (special tokens), values inline; a forced
    call writes the template's layout."""
    name = "seed_oss"
    start, end = "<seed:tool_call>", "</seed:tool_call>"
    markers = (start,)
    keeps_special_tokens = True
    syntax = CallSyntax("", "\n", "", start + "\n" + FUNCTION, ">\n", FUNCTION_END + "\n" + end, args="xml",
                        param=(PARAM, ">", PARAM_END + "\n"))
