"""Hermes / Qwen2.5 tool calls: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block a
call (parallel calls are several blocks), text around them is content. SmolLM2's variant (its
function-calling data, Argilla's Synth-APIGen) puts a JSON list in one block:
`<tool_call>[{"name": ..., "arguments": ...}, ...]</tool_call>` (an empty list: no call). No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import INVALID, OPEN, CallScan, CallSyntax, GroupScan, ToolParser, \
    call_array_at, call_object_at, closing
from radixlang_runtime.tool_parsers.json_scan import skip_ws

START, END = "<tool_call>", "</tool_call>"
_CALL = ('{"name": "', '", "arguments": ', "}")
BLOCKS = CallSyntax(START + "\n", "\n" + END + "\n" + START + "\n", "\n" + END, *_CALL)  # one block a call
LIST = CallSyntax(START + "[\n", ",\n", "\n]" + END, *_CALL)  # SmolLM2: the calls as a list in one block


class HermesParser(ToolParser):
    name = "hermes"
    markers = (START,)
    syntax = BLOCKS

    @classmethod
    def call_syntax(cls, list_form: bool = False) -> CallSyntax:
        return LIST if list_form else BLOCKS

    def parse_group(self, text: str, final: bool) -> GroupScan:
        calls: list[CallScan] = []
        i = skip_ws(text, len(START))
        if i >= len(text):
            return GroupScan(calls, INVALID if final else OPEN, len(text))
        at = call_array_at if text[i] == "[" else call_object_at
        status, end = at(text, i, final, self.tool_names, calls, self.scan_at)
        if status == INVALID or status == OPEN:
            return GroupScan(calls, status, end)
        return closing(text, end, END, final, calls)
