"""Jamba (AI21) tool calls: a JSON list of `{"name": ..., "arguments": {...}}` objects between the special tokens
`<tool_calls>` and `</tool_calls>`; text before it is content. Hunyuan-A13B writes the same group (vLLM's
`hunyuan_a13b`, an alias here). The close token may be missing at the very end. A forced tool_choice writes
the list in its tokens. No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import INVALID, OPEN, CallScan, CallSyntax, GroupScan, ToolParser, \
    call_array_at, closing
from radixlang_runtime.tool_parsers.json_scan import skip_ws

START, END = "<tool_calls>", "</tool_calls>"


class JambaParser(ToolParser):
    name = "jamba"
    markers = (START,)
    keeps_special_tokens = True
    syntax = CallSyntax(START + "[", ", ", "]" + END, '{"name": "', '", "arguments": ', "}")

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
        return closing(text, end, END, final, calls)
