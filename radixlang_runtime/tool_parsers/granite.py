"""IBM Granite 3.x tool calls: the whole output is a JSON list of `{"name": ..., "arguments": {...}}` objects,
after `<|tool_call|>` (Granite 3.0's special token) or `<tool_call>` (Granite 3.1's text), or bare (vLLM's
granite reading). Anything else before it makes the output plain text; text after the list is content.
A forced tool_choice writes the token form. Granite 4.0 writes Hermes' `<tool_call>{...}</tool_call>` blocks
(`granite4`, an alias of `hermes`). No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import OPEN, CallSyntax, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.json_scan import skip_ws
from radixlang_runtime.tool_parsers.llama3 import start_only_group

BOT_TOKEN, BOT_STRING = "<|tool_call|>", "<tool_call>"


class GraniteParser(ToolParser):
    name = "granite"
    keeps_special_tokens = True
    syntax = CallSyntax(BOT_TOKEN + "[", ", ", "]", '{"name": "', '", "arguments": ', "}")

    def find_group(self, text: str) -> tuple[int, int]:
        return start_only_group(self, text, (BOT_TOKEN, BOT_STRING, "["))

    def parse_group(self, text: str, final: bool) -> GroupScan:
        i = 0
        for bot in (BOT_TOKEN, BOT_STRING):  # vLLM strips the token, then the string
            if text.startswith(bot, i):
                i = skip_ws(text, i + len(bot))
        if i < len(text) and not final and BOT_STRING.startswith(text[i:]):
            return GroupScan([], OPEN, len(text))
        return self.call_array_group(text, i, "", final)
