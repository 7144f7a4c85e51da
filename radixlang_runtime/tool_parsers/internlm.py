"""InternLM2 / Intern-S1 tool calls: one JSON object `{"name": ..., "parameters": {...}}` (or "arguments") a block,
between the special tokens `<|action_start|><|plugin|>` (SGLang reads a space between the two) and
`<|action_end|>`; blocks follow one another, text before them is content. The close token may be missing at the
very end. A forced tool_choice writes vLLM's layout, `<|action_start|><|plugin|>\\n{...}<|action_end|>`. No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import COMPLETE, CallScan, CallSyntax, GroupScan, ToolParser, \
    call_object_at, closing
from radixlang_runtime.tool_parsers.json_scan import skip_ws
from radixlang_runtime.tool_parsers.markup import expect

START, PLUGIN, END = "<|action_start|>", "<|plugin|>", "<|action_end|>"


class InternlmParser(ToolParser):
    name = "internlm"
    markers = (START,)
    keeps_special_tokens = True
    syntax = CallSyntax(START + PLUGIN + "\n", END + START + PLUGIN + "\n", END, '{"name": "', '", "parameters": ',
                        "}")

    def parse_group(self, text: str, final: bool) -> GroupScan:
        calls: list[CallScan] = []
        st, i = expect(text, skip_ws(text, len(START)), PLUGIN, final)
        if st != COMPLETE:
            return GroupScan(calls, st, i)
        status, end = call_object_at(text, skip_ws(text, i), final, self.tool_names, calls, self.scan_at)
        if status != COMPLETE:
            return GroupScan(calls, status, end)
        return closing(text, end, END, final, calls)
