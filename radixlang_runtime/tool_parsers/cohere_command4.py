"""Cohere Command 4 (Command A family) tool calls: a JSON list of `{"tool_call_id": ..., "tool_name": ...,
"parameters": {...}}` objects between the special tokens `<|START_ACTION|>` and `<|END_ACTION|>` (one object
without the list is read too); text before it is content; the model's tool_call_id is not kept (SGLang's
cohere_command4 reading). The close token may be missing at the very end. A forced tool_choice writes SGLang's
layout. No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import CallSyntax, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.json_scan import skip_ws

START, END = "<|START_ACTION|>", "<|END_ACTION|>"


class CohereCommand4Parser(ToolParser):
    name = "cohere_command4"
    markers = (START,)
    keeps_special_tokens = True
    syntax = CallSyntax(START + "[", ", ", "]" + END, '{"tool_call_id": "0", "tool_name": "', '", "parameters": ',
                        "}")

    def parse_group(self, text: str, final: bool) -> GroupScan:
        return self.call_array_group(text, skip_ws(text, len(START)), END, final, single=True, name_key="tool_name")
