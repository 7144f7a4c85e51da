"""MiniCPM (openbmb's MiniCPM-4 and later) tool calls: XML, one `<function>` element a call, calls back to back,
text around them is content:
  <function name="get_weather"><param name="city">Paris</param><param name="days">2</param></function>
(SGLang's minicpm5 and vLLM's minicpm5xml readings.) An attribute's value takes double or single quotes. A value
in a CDATA section (`<param name="code"><![CDATA[if a < b:]]></param>`) is its text as written; outside one,
XML's entities (`&lt;` `&gt;` `&amp;` `&quot;` `&apos;`, `&#N;` / `&#xN;`) read as their characters. Whitespace
around a value is layout. A parameter the schema types as a string is that text; any other reads as JSON, else
a Python literal, else stays text. As SGLang reads them, a `<function>` whose parameters the tool's schema does not
list, that names one twice or leaves out a required one is not a call (it stays text), so a call is sent whole
once its `</function>` is read; a call cut off before it stays text. No CallSyntax: tool_choice cannot force it
(a value's text is XML's, not the text as written). No torch."""

from __future__ import annotations

import re
from typing import Any, Optional

from radixlang_runtime.tool_parsers.base import DONE, INVALID, OPEN, CallScan, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.json_scan import COMPLETE, skip_ws
from radixlang_runtime.tool_parsers.markup import XML_KEY, arguments_json, expect, known, loose_value, \
    param_schema, read_until

START, FUNCTION_END, PARAM, PARAM_END = "<function", "</function>", "<param", "</param>"
CDATA, CDATA_END = "<![CDATA[", "]]>"
NAME_ATTR = "name="
NO_LIMIT = 1 << 60
_ENTITY = re.compile(r"&(lt|gt|amp|quot|apos|#[0-9]{1,7}|#x[0-9a-fA-F]{1,6});")
_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}


def _entity(m: re.Match) -> str:
    ref = m.group(1)
    if ref in _NAMED:
        return _NAMED[ref]
    code = int(ref[2:], 16) if ref.startswith("#x") else int(ref[1:])
    return chr(code) if 0 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else m.group(0)


def xml_text(raw: str) -> str:
    """A value's text as written -> its text: whitespace around it dropped; a CDATA section's content as it
    is (whitespace around it dropped too, as SGLang does), else the XML entities replaced."""
    text = raw.strip()
    if text.startswith(CDATA) and text.endswith(CDATA_END) and len(text) >= len(CDATA) + len(CDATA_END):
        return text[len(CDATA):-len(CDATA_END)].strip()
    return _ENTITY.sub(_entity, text)


def minicpm_value(text: str, schema: Optional[dict]) -> Any:
    """A parameter's text -> its value: the text where the schema's type is (or lists) string (`null` is None
    where it lists null too); otherwise JSON, else a Python literal, else the text."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    kinds = kind if isinstance(kind, list) else [kind]
    if "string" in kinds and not (text == "null" and "null" in kinds):
        return text
    return loose_value(text)


def open_tag(text: str, i: int, tag: str, final: bool) -> tuple[str, Optional[str], int]:
    """`<TAG name="X">` at text[i] (whitespace before `name=` and before `>`; single or double quotes) ->
    (COMPLETE, X, one past `>`) / (OPEN, None, len) / (INVALID, None, index)."""
    st, j = expect(text, i, tag, final)
    if st != COMPLETE:
        return st, None, j
    k = skip_ws(text, j)
    if k == j:  # the tag's name goes on (`<functions>`) or nothing follows it yet
        return (OPEN, None, len(text)) if k == len(text) and not final else (INVALID, None, j)
    st, q = expect(text, k, NAME_ATTR, final)
    if st != COMPLETE:
        return st, None, q
    if q == len(text):
        return (INVALID if final else OPEN), None, q
    if text[q] not in "\"'":
        return INVALID, None, q
    st, e = read_until(text, q + 1, text[q], final)
    if st != COMPLETE:
        return st, None, e
    st, end = expect(text, skip_ws(text, e + 1), ">", final)
    return (st, text[q + 1:e].strip(), end) if st == COMPLETE else (st, None, end)


class MiniCpm5Parser(ToolParser):
    name = "minicpm5"
    markers = (START,)
    keeps_special_tokens = True  # the tags are special tokens of MiniCPM's tokenizer
    syntax = None

    def parse_group(self, text: str, final: bool) -> GroupScan:
        """text starts at `<function`: the call once its `</function>` is read. The parameters read are kept
        (the parser's scanner cache) and the next delta resumes after them."""
        state = self._scanners.get(("minicpm5", 0))  # [resume index, name, [(key, value)]]
        if state is None:
            st, name, i = open_tag(text, 0, START, final)
            if st != COMPLETE:
                return GroupScan([], st, i)
            if not XML_KEY.fullmatch(name) or not known(self, name):
                return GroupScan([], INVALID, 0)
            state = self._scanners[("minicpm5", 0)] = [i, name, []]
        i, name, items = state
        while True:
            i = skip_ws(text, i)
            st_end, end = expect(text, i, FUNCTION_END, final)
            if st_end == COMPLETE:
                return self._call(name, items, end)
            st, key, j = open_tag(text, i, PARAM, final)
            if st != COMPLETE:
                return GroupScan([], OPEN, len(text)) if OPEN in (st, st_end) else GroupScan([], INVALID, i)
            st, r = read_until(text, j, PARAM_END, final, NO_LIMIT)
            if st != COMPLETE:
                return GroupScan([], st, r)
            if not XML_KEY.fullmatch(key) or any(key == k for k, _ in items):
                return GroupScan([], INVALID, i)
            items.append((key, minicpm_value(xml_text(text[j:r]), param_schema(self, name, key))))
            i = state[0] = r + len(PARAM_END)

    def _call(self, name: str, items: list[tuple[str, Any]], end: int) -> GroupScan:
        """A whole `<function>` -> the call, or INVALID where the tool's schema refuses its parameters."""
        schema = self.schemas.get(name)
        props = schema.get("properties") if isinstance(schema, dict) else None
        required = schema.get("required") if isinstance(schema, dict) else None
        keys = {k for k, _ in items}
        if isinstance(props, dict) and props and not keys <= set(props):
            return GroupScan([], INVALID, 0)
        if isinstance(required, list) and not {r for r in required if isinstance(r, str)} <= keys:
            return GroupScan([], INVALID, 0)
        return GroupScan([CallScan(name, arguments_json(items, True), True)], DONE, end)
