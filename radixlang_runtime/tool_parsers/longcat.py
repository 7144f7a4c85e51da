"""LongCat-Flash tool calls: Hermes' JSON call object in LongCat's own tags, one block a call, blocks back to back,
text around them is content:
  <longcat_tool_call>\\n{"name": ..., "arguments": {...}}\\n</longcat_tool_call><longcat_tool_call>\\n...
(SGLang's and vLLM's longcat readings; a JSON list of calls in one block is read too, as hermes reads it.) The
close tag may be missing at the very end. A forced tool_choice writes SGLang's layout. No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import CallSyntax, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.json_scan import skip_ws

START, END = "<longcat_tool_call>", "</longcat_tool_call>"


class LongcatParser(ToolParser):
    name = "longcat"
    markers = (START,)
    keeps_special_tokens = True  # the tags are added tokens of LongCat's tokenizer
    syntax = CallSyntax(START + "\n", "\n" + END + START + "\n", "\n" + END, '{"name": "', '", "arguments": ', "}")

    def parse_group(self, text: str, final: bool) -> GroupScan:
        return self.call_array_group(text, skip_ws(text, len(START)), END, final, single=True)
