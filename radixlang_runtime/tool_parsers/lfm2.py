"""LFM2 (Liquid) tool calls: a Python list of calls between special tokens, text around them is content:
  <|tool_call_start|>[get_weather(city="Paris"), now()]<|tool_call_end|>
The tokens may instead hold one call without the list, or the calls as a JSON list of
`{"name": ..., "arguments": {...}}` objects (SGLang's lfm2 reads all three). Python values read as the pythonic
format reads them; a call's arguments stream one keyword at a time (JSON: as written). The close token may
be missing at the very end. A forced tool_choice writes the Python list. No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import INVALID, OPEN, CallScan, CallSyntax, GroupScan, ToolParser, \
    call_array_at, closing
from radixlang_runtime.tool_parsers.json_scan import COMPLETE, skip_ws
from radixlang_runtime.tool_parsers.pythonic import PythonicParser

START, END = "<|tool_call_start|>", "<|tool_call_end|>"


class Lfm2Parser(PythonicParser):
    name = "lfm2"
    markers = (START,)
    keeps_special_tokens = True
    syntax = CallSyntax(START + "[", ", ", "]" + END, "", "(", ")", args="python")

    def find_group(self, text: str) -> tuple[int, int]:
        return ToolParser.find_group(self, text)  # anywhere in the output, not only at its start

    def parse_group(self, text: str, final: bool) -> GroupScan:
        calls: list[CallScan] = []
        i = skip_ws(text, len(START))
        if i >= len(text):
            return GroupScan(calls, INVALID if final else OPEN, len(text))
        if text[i] == "[":
            j = skip_ws(text, i + 1)
            if j >= len(text) and not final:
                return GroupScan(calls, OPEN, len(text))  # a JSON or a Python list: not decided yet
            if j < len(text) and text[j] == "{":
                status, end = call_array_at(text, i, final, self.tool_names, calls, self.scan_at)
            else:
                status, end = self.call_list(text, i, final, calls)
        else:
            status, end = self._call(text, i, final, calls)
        if status != COMPLETE:
            return GroupScan(calls, status, end)
        return closing(text, end, END, final, calls)
