"""Phi-4-mini tool calls: `functools[{"name": ..., "arguments": {...}}, ...]` (a call's arguments may be named
"parameters", as vLLM's phi4_mini_json reads them); text before it is content, the list may come anywhere.
A forced tool_choice writes the list with "arguments". No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import INVALID, OPEN, CallScan, CallSyntax, GroupScan, ToolParser, \
    call_array_at, closing

START = "functools"


class Phi4MiniJsonParser(ToolParser):
    name = "phi4_mini_json"
    markers = (START,)
    syntax = CallSyntax(START + "[", ", ", "]", '{"name": "', '", "arguments": ', "}")

    def parse_group(self, text: str, final: bool) -> GroupScan:
        calls: list[CallScan] = []
        i = len(START)
        if i >= len(text):
            return GroupScan(calls, INVALID if final else OPEN, len(text))
        if text[i] != "[":
            return GroupScan(calls, INVALID, i)
        status, end = call_array_at(text, i, final, self.tool_names, calls, self.scan_at)
        if status == INVALID or status == OPEN:
            return GroupScan(calls, status, end)
        return closing(text, end, "", final, calls)
