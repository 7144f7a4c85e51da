"""Jamba (AI21) tool calls: a JSON list of `{"name": ..., "arguments": {...}}` objects between the special tokens
`<tool_calls>` and `</tool_calls>`; text before it is content. Hunyuan-A13B writes the same group (vLLM's
`hunyuan_a13b`, an alias here). The close token may be missing at the very end. A forced tool_choice writes
the list in its tokens. No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import CallSyntax, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.json_scan import skip_ws

START, END = "<tool_calls>", "</tool_calls>"


class JambaParser(ToolParser):
    name = "jamba"
    markers = (START,)
    keeps_special_tokens = True
    syntax = CallSyntax(START + "[", ", ", "]" + END, '{"name": "', '", "arguments": ', "}")

    def parse_group(self, text: str, final: bool) -> GroupScan:
        i = skip_ws(text, len(START))
        return self.call_array_group(text, i, END, final)
