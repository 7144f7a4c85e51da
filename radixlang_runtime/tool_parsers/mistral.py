"""Mistral tool calls: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (content may come before;
`[TOOL_CALLS]` is a control token the detokenizer must keep). The v11 tokenizer's
`[TOOL_CALLS]name[ARGS]{...}` form is not read (it stays text). No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import CallSyntax, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.json_scan import skip_ws

START = "[TOOL_CALLS]"


class MistralParser(ToolParser):
    name = "mistral"
    markers = (START,)
    keeps_special_tokens = True
    syntax = CallSyntax(START + "[", ", ", "]", '{"name": "', '", "arguments": ', "}")

    def parse_group(self, text: str, final: bool) -> GroupScan:
        i = skip_ws(text, len(START))
        return self.call_array_group(text, i, "", final)
