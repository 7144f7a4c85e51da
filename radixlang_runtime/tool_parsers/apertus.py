"""Apertus tool calls: a JSON list of single-member objects, each a function's name holding its arguments,
between special tokens; text around the group is content:
  <|tools_prefix|>[{"get_weather": {"city": "Paris"}}, {"now": {}}]<|tools_suffix|>
(SGLang's apertus2509 and vLLM's apertus readings; one object without the list is read too, as vLLM reads it.)
A call commits once its name is read and its arguments object has begun; an object with a second member, or
whose value is not an object, is not a call. The close token may be missing at the very end. A forced
tool_choice writes the list. No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import INVALID, OPEN, CallScan, CallSyntax, GroupScan, ToolParser, closing
from radixlang_runtime.tool_parsers.json_scan import COMPLETE, skip_ws
from radixlang_runtime.tool_parsers.markup import known

START, END = "<|tools_prefix|>", "<|tools_suffix|>"


class ApertusParser(ToolParser):
    name = "apertus"
    markers = (START,)
    keeps_special_tokens = True
    syntax = CallSyntax(START + "[", ", ", "]" + END, '{"', '": ', "}")

    def parse_group(self, text: str, final: bool) -> GroupScan:
        calls: list[CallScan] = []
        i = skip_ws(text, len(START))
        if i >= len(text):
            return GroupScan(calls, INVALID if final else OPEN, len(text))
        if text[i] == "{":
            status, end = self._call_at(text, i, final, calls)
            return closing(text, end, END, final, calls) if status == COMPLETE else GroupScan(calls, status, end)
        if text[i] != "[":
            return GroupScan(calls, INVALID, i)
        j = skip_ws(text, i + 1)
        if j < len(text) and text[j] == "]":
            return closing(text, j + 1, END, final, calls)
        while True:
            status, end = self._call_at(text, j, final, calls)
            if status != COMPLETE:
                return GroupScan(calls, status, end)
            k = skip_ws(text, end)
            if k >= len(text):
                return GroupScan(calls, INVALID if final else OPEN, len(text))
            if text[k] == "]":
                return closing(text, k + 1, END, final, calls)
            if text[k] != ",":
                return GroupScan(calls, INVALID, k)
            j = k + 1

    def _call_at(self, text: str, i: int, final: bool, calls: list[CallScan]) -> tuple[str, int]:
        """One `{"NAME": {...}}` object at text[i:] (whitespace first), appended to calls once committed ->
        (COMPLETE, one past it) / (OPEN, len) / (INVALID, index)."""
        scan = self.scan_at(text, i)
        if scan.start >= len(text):
            return (INVALID if final else OPEN), len(text)
        if text[scan.start] != "{" or scan.status == INVALID:
            return INVALID, scan.end
        members = scan.members
        if not members or members[0].start < 0:  # the name is not decided yet
            return (INVALID, scan.end) if final or scan.status == COMPLETE else (OPEN, len(text))
        first = members[0]
        if len(members) > 1 or text[first.start] != "{" or not known(self, first.key):
            return INVALID, first.start
        if scan.status == COMPLETE:
            calls.append(CallScan(first.key, text[first.start:first.end], True))
            return COMPLETE, scan.end
        if final:
            return INVALID, scan.end  # cut off
        calls.append(CallScan(first.key, text[first.start:first.end or len(text)], False))
        return OPEN, len(text)
