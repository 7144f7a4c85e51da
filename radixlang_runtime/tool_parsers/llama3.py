"""Llama 3.1 / 3.2 JSON tool calls: the whole output is `{"name": ..., "parameters": {...}}`, optionally
after `<|python_tag|>` (a special token the detokenizer must keep); several calls are separated by `;`
(vLLM's reading). Anything before it makes the output plain text, as in Meta's format. No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import COMPLETE, DONE, INVALID, OPEN, CallScan, CallSyntax, GroupScan, \
    ToolParser, call_object_at
from radixlang_runtime.tool_parsers.json_scan import skip_ws

PYTHON_TAG = "<|python_tag|>"
END_MARKERS = ("<|eom_id|>", "<|eot_id|>")  # end of turn, when special tokens are kept


def start_only_group(parser: ToolParser, text: str, openers: tuple[str, ...]) -> tuple[int, int]:
    """find_group of formats whose one group must open the output (after whitespace)."""
    if not parser.at_output_start:
        return -1, len(text)
    i = skip_ws(text, 0)
    if i == len(text):
        return -1, 0  # only whitespace yet: undecided
    if any(text.startswith(o, i) for o in openers):
        return i, len(text)
    if any(o.startswith(text[i:]) for o in openers):
        return -1, 0
    return -1, len(text)


class Llama3JsonParser(ToolParser):
    name = "llama3"
    keeps_special_tokens = True
    syntax = CallSyntax("", "; ", "", '{"name": "', '", "parameters": ', "}")  # no <|python_tag|>: custom tools

    def find_group(self, text: str) -> tuple[int, int]:
        return start_only_group(self, text, (PYTHON_TAG, "{"))

    def parse_group(self, text: str, final: bool) -> GroupScan:
        calls: list[CallScan] = []
        i = len(PYTHON_TAG) if text.startswith(PYTHON_TAG) else 0
        while True:
            status, end = call_object_at(text, i, final, self.tool_names, calls, self.scan_at)
            if status != COMPLETE:
                return GroupScan(calls, status, end)
            k = skip_ws(text, end)
            if k == len(text):
                return GroupScan(calls, DONE if final else OPEN, k)
            ends = [m for m in END_MARKERS if text.startswith(m, k)]
            if ends:
                return GroupScan(calls, DONE, k + len(ends[0]))
            if text[k] != ";":
                if not final and any(m.startswith(text[k:]) for m in END_MARKERS):
                    return GroupScan(calls, OPEN, len(text))
                return GroupScan(calls, INVALID, k)
            i = k + 1
