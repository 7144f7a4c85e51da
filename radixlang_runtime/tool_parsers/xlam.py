"""xLAM (Salesforce) tool calls: a JSON list of `{"name": ..., "arguments": {...}}` objects, written as the whole
output, or anywhere in a ```` ```json ```` (or bare ```` ``` ````) fence, a `<tool_call>...</tool_call>` block or
after `[TOOL_CALLS]` (the shapes vLLM's xlam reads); text around a fence or block is content. A forced
tool_choice writes the bare list. No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import OPEN, CallSyntax, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.json_scan import COMPLETE, skip_ws
from radixlang_runtime.tool_parsers.llama3 import start_only_group
from radixlang_runtime.tool_parsers.markup import expect

FENCE, BLOCK, BLOCK_END, TOOL_CALLS = "```", "<tool_call>", "</tool_call>", "[TOOL_CALLS]"


class XlamParser(ToolParser):
    name = "xlam"
    markers = (FENCE, BLOCK, TOOL_CALLS)
    syntax = CallSyntax("[", ", ", "]", '{"name": "', '", "arguments": ', "}")

    def find_group(self, text: str) -> tuple[int, int]:
        start, hold = start_only_group(self, text, ("[",))
        if start >= 0 or hold == 0:
            return start, hold
        return ToolParser.find_group(self, text)

    def parse_group(self, text: str, final: bool) -> GroupScan:
        close, i = "", 0
        if text.startswith(FENCE):
            close, i = FENCE, len(FENCE)
            st, j = expect(text, i, "json", final)
            if st == OPEN:
                return GroupScan([], OPEN, j)
            i = j if st == COMPLETE else i
        elif text.startswith(BLOCK):
            close, i = BLOCK_END, len(BLOCK)
        elif text.startswith(TOOL_CALLS):
            i = len(TOOL_CALLS)
        i = skip_ws(text, i)
        return self.call_array_group(text, i, close, final)
