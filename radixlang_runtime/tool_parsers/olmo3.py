"""Olmo 3 tool calls: Python calls with keyword arguments, one a line, between `<function_calls>` and
`</function_calls>`; text before the group is content:
  <function_calls>
  get_weather(city="Paris", metric=true)
  now()
  </function_calls>
Values are Python literals, or JSON's true / false / null (vLLM's olmo3 reading); a call's arguments stream
one keyword at a time. The close tag may be missing at the very end. A forced tool_choice writes Python
literals. No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import CallScan, CallSyntax, GroupScan, ToolParser, closing
from radixlang_runtime.tool_parsers.json_scan import COMPLETE, skip_ws
from radixlang_runtime.tool_parsers.pythonic import PythonicParser

START, END = "<function_calls>", "</function_calls>"


class Olmo3Parser(PythonicParser):
    name = "olmo3"
    markers = (START,)
    json_names = True
    syntax = CallSyntax(START + "\n", "\n", "\n" + END, "", "(", ")", args="python")

    def find_group(self, text: str) -> tuple[int, int]:
        return ToolParser.find_group(self, text)  # anywhere in the output, not only at its start

    def parse_group(self, text: str, final: bool) -> GroupScan:
        calls: list[CallScan] = []
        i = skip_ws(text, len(START))
        while True:
            status, end = self._call(text, i, final, calls)
            if status != COMPLETE:
                return GroupScan(calls, status, end)
            k = skip_ws(text, end)
            if k >= len(text) or text.startswith("<", k) or "\n" not in text[end:k]:
                return closing(text, end, END, final, calls)  # the calls end here (a call a line)
            i = k
