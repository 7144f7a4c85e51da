"""DeepSeek tool calls (special tokens the detokenizer must keep), content may come before:
V3 / R1 (`deepseekv3`):
  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>
  (\\n and the next call ...)<｜tool▁calls▁end｜>
V3.1 (`deepseekv31`):
  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
No torch."""

from __future__ import annotations

import re
from typing import Optional

from radixlang_runtime.tool_parsers.base import CallSyntax, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.markup import Section, parse_section

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_NAME = re.compile(r"[^\s<>｜]+")


def _name(text: str) -> Optional[str]:
    text = text.strip()
    return text if _NAME.fullmatch(text) else None


class DeepSeekV3Parser(ToolParser):
    name = "deepseekv3"
    markers = (CALLS_BEGIN,)
    keeps_special_tokens = True
    section = Section(CALLS_BEGIN, CALL_BEGIN, "\n```json", CALL_END, CALLS_END, args_close="```")
    syntax = CallSyntax(CALLS_BEGIN, "\n", CALLS_END, CALL_BEGIN + "function" + SEP, "\n```json\n",
                        "\n```" + CALL_END)

    @staticmethod
    def read_name(header: str) -> Optional[str]:
        kind, sep, name = header.partition(SEP)
        return _name(name) if sep and kind.strip() == "function" else None

    def parse_group(self, text: str, final: bool) -> GroupScan:
        return parse_section(self, self.section, self.read_name, text, final)


class DeepSeekV31Parser(DeepSeekV3Parser):
    name = "deepseekv31"
    section = Section(CALLS_BEGIN, CALL_BEGIN, SEP, CALL_END, CALLS_END)
    syntax = CallSyntax(CALLS_BEGIN, "", CALLS_END, CALL_BEGIN, SEP, CALL_END)

    @staticmethod
    def read_name(header: str) -> Optional[str]:
        return _name(header)
