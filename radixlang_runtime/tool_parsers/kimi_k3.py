"""Kimi K3 tool calls: XTML channels built from the special tokens `<|open|>`, `<|close|>` and `<|sep|>`; the
calls are in a `tools` channel, the reply before it (in a `response` channel, whose markers are not content):
  <|open|>response<|sep|>TEXT<|close|>response<|sep|>
  <|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|>
  <|open|>argument key="KEY" type="string"<|sep|>TEXT<|close|>argument<|sep|>
  <|open|>argument key="KEY" type="object"<|sep|>{"a": 1}<|close|>argument<|sep|>
  <|close|>call<|sep|><|close|>tools<|sep|>
`type="string"`: the value is the text as written; any other type: JSON (text that is not JSON stays text).
Attribute values undo the template's `&quot;` / `&amp;` escapes (vLLM's and SGLang's kimi_k3 readings). A call's
arguments stream one argument at a time; the tools close may be missing at the very end. tool_choice cannot
force it (the peers force it with a structural tag). No torch."""

from __future__ import annotations

import re
from typing import Any, Optional

from radixlang_runtime.tool_parsers.base import DONE, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.invoke import Invokes, parse_invokes
from radixlang_runtime.tool_parsers.markup import read_json
from radixlang_runtime.tool_parsers.qwen3_coder import ParamFields

SEP = "<|sep|>"
TOOLS_OPEN, TOOLS_CLOSE = "<|open|>tools" + SEP, "<|close|>tools" + SEP
# the reply's channel markers: dropped from the content
RESPONSE_MARKERS = ("<|open|>response" + SEP, "<|close|>response" + SEP, "<|close|>message" + SEP)
_ATTRS = re.compile(r'\s*(\w+)="([^"]*)"(?:\s+(\w+)="([^"]*)")?\s*')


def _attrs(header: str) -> dict[str, str]:
    """`a="x" b="y"` (one or two attributes) -> their values, unescaped; {} if the text is not that."""
    m = _ATTRS.fullmatch(header)
    if m is None:
        return {}
    pairs = [(m.group(1), m.group(2))] + ([(m.group(3), m.group(4))] if m.group(3) else [])
    return {k: v.replace("&quot;", '"').replace("&amp;", "&") for k, v in pairs}


class K3Fields(ParamFields):
    """A call's header is `tool="NAME" index="N"`; an argument's `key="KEY" type="TYPE"`, its value as written."""

    def call_name(self, header: str) -> Optional[str]:
        return _attrs(header).get("tool") or None

    def key(self, text: str) -> Optional[tuple[str, str]]:
        attrs = _attrs(text)
        return (attrs["key"], attrs.get("type", "string")) if "key" in attrs else None

    def value(self, parser: ToolParser, name: str, key: str, flag: str, raw: str) -> Any:
        if flag == "string":
            return raw
        value = read_json(raw)
        return raw if value is ValueError else value

    def layout(self, raw: str) -> str:
        return raw


class KimiK3Parser(ToolParser):
    name = "kimi_k3"
    markers = (TOOLS_OPEN, *RESPONSE_MARKERS)
    keeps_special_tokens = True
    invokes = Invokes(TOOLS_OPEN, TOOLS_CLOSE, "<|open|>call ", "<|close|>call" + SEP, "<|open|>argument ",
                      "<|close|>argument" + SEP, header_end=SEP, key_end=SEP)
    fields = K3Fields()
    syntax = None

    def parse_group(self, text: str, final: bool) -> GroupScan:
        for marker in RESPONSE_MARKERS:
            if text.startswith(marker):
                return GroupScan([], DONE, len(marker))  # a channel marker, no call
        return parse_invokes(self, self.invokes, self.fields, text, final)
