"""Mistral tool calls: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (content may come before;
`[TOOL_CALLS]` is a control token the detokenizer must keep). The v11 tokenizer's
`[TOOL_CALLS]name[ARGS]{...}` form is not read (it stays text). No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import INVALID, OPEN, CallScan, CallSyntax, GroupScan, ToolParser, \
    call_array_at, closing
from radixlang_runtime.tool_parsers.json_scan import skip_ws

START = "[TOOL_CALLS]"


class MistralParser(ToolParser):
    name = "mistral"
    markers = (START,)
    keeps_special_tokens = True
    syntax = CallSyntax(START + "[", ", ", "]", '{"name": "', '", "arguments": ', "}")

    def parse_group(self, text: str, final: bool) -> GroupScan:
        calls: list[CallScan] = []
        i = skip_ws(text, len(START))
        if i >= len(text):
            return GroupScan(calls, INVALID if final else OPEN, len(text))
        if text[i] != "[":
            return GroupScan(calls, INVALID, i)
        status, end = call_array_at(text, i, final, self.tool_names, calls, self.scan_at)
        if status == INVALID or status == OPEN:
            return GroupScan(calls, status, end)
        return closing(text, end, "", final, calls)
