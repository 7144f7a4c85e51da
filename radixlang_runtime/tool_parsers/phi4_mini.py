"""Phi-4-mini tool calls: `functools[{"name": ..., "arguments": {...}}, ...]` (a call's arguments may be named
"parameters", as vLLM's phi4_mini_json reads them); text before it is content, the list may come anywhere.
A forced tool_choice writes the list with "arguments". No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import CallSyntax, GroupScan, ToolParser

START = "functools"


class Phi4MiniJsonParser(ToolParser):
    name = "phi4_mini_json"
    markers = (START,)
    syntax = CallSyntax(START + "[", ", ", "]", '{"name": "', '", "arguments": ', "}")

    def parse_group(self, text: str, final: bool) -> GroupScan:
        return self.call_array_group(text, len(START), "", final)
