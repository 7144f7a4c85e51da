"""Hermes / Qwen2.5 tool calls: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block a
call (parallel calls are several blocks), text around them is content. SmolLM2's variant (its
function-calling data, Argilla's Synth-APIGen) puts a JSON list in one block:
`<tool_call>[{"name": ..., "arguments": ...}, ...]</tool_call>` (an empty list: no call). No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import CallSyntax, GroupScan, ToolParser
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
        return self.call_array_group(text, skip_ws(text, len(START)), END, final, single=True)
