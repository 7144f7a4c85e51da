"""Kimi K2 tool calls (special tokens the detokenizer must keep), content may come before:
  <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}
  <|tool_call_end|>...<|tool_calls_section_end|>
IDX counts the calls of the conversation; the call's name is the part between `functions.` (optional) and
`:IDX`. The chat template writes a history call's `id` as its header (and a result as `## Return of ID`), so a
call's id is `functions.NAME:IDX` too, IDX counted on from the conversation's earlier calls. A forced call's
IDX is the model's to write (any index reads back). No torch."""

from __future__ import annotations

import re
from typing import Optional

from radixlang_runtime.tool_parsers.base import CallSyntax, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.markup import Section, parse_section

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGS_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_HEADER = re.compile(r"\s*(?:functions\.)?([A-Za-z0-9_\-.]+?):\d+\s*")


class KimiK2Parser(ToolParser):
    name = "kimi_k2"
    markers = (SECTION_BEGIN,)
    keeps_special_tokens = True
    section = Section(SECTION_BEGIN, CALL_BEGIN, ARGS_BEGIN, CALL_END, SECTION_END)
    syntax = CallSyntax(SECTION_BEGIN, "", SECTION_END, CALL_BEGIN + "functions.", ARGS_BEGIN, CALL_END, index=":")

    def call_id(self, name: str, index: int) -> str:
        return f"functions.{name}:{self.past_calls + index}"

    @staticmethod
    def read_name(header: str) -> Optional[str]:
        m = _HEADER.fullmatch(header)
        return m.group(1) if m else None

    def parse_group(self, text: str, final: bool) -> GroupScan:
        return parse_section(self, self.section, self.read_name, text, final)
