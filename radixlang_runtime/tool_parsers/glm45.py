"""GLM-4.5 / 4.6 tool calls: XML, one `<tool_call>` block a call, text around them is content:
  <tool_call>NAME\\n<arg_key>KEY</arg_key>\\n<arg_value>VALUE</arg_value>\\n...</tool_call>
GLM-4.7 / GLM-5 (`glm47`) write the same tags with no whitespace between them, calls back to back:
  <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call><tool_call>...
The chat template writes strings as they are and other values as JSON; a value becomes the JSON value the
tool's parameters schema types it as (markup.typed_value). Arguments stream one parameter at a time; the
closing tag may be missing at the very end (the model stopped on <|observation|>). A forced tool_choice
writes the template's layout (calls one block each on their own lines) with the schema's properties in
order, a string parameter's value as text without `<`, others as JSON (server/openai_tools.forced_call_regex).
No torch."""

from __future__ import annotations

import re

from radixlang_runtime.tool_parsers.base import DONE, INVALID, OPEN, CallScan, CallSyntax, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.json_scan import COMPLETE
from radixlang_runtime.tool_parsers.markup import MAX_HEADER, known
from radixlang_runtime.tool_parsers.qwen3_coder import xml_params

START, END = "<tool_call>", "</tool_call>"
KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
_NAME = re.compile(r"[^\s<>]+")
SYNTAX = CallSyntax("", "\n", "", START, "\n", END, args="xml", param=(KEY, KEY_END + "\n" + VALUE, VALUE_END + "\n"))


class Glm45Parser(ToolParser):
    name = "glm45"
    markers = (START,)
    keeps_special_tokens = True  # <tool_call> / <arg_key> are special tokens of GLM-4.5's tokenizer
    syntax = SYNTAX

    def parse_group(self, text: str, final: bool) -> GroupScan:
        calls: list[CallScan] = []
        j = len(START)
        k = j
        while k < len(text) and text[k] not in "\n<" and k - j <= MAX_HEADER:
            k += 1
        name = text[j:k].strip()
        if k == len(text) and not final and k - j <= MAX_HEADER:
            return GroupScan(calls, OPEN, k)
        if not _NAME.fullmatch(name) or not known(self, name):
            return GroupScan(calls, INVALID, j)
        st, end = xml_params(self, text, k, final, name, calls, (KEY, KEY_END, VALUE, VALUE_END, END),
                             close_optional=True)
        if st == COMPLETE:
            return GroupScan(calls, DONE, end)
        return GroupScan(calls, st, end)


class Glm47Parser(Glm45Parser):
    """GLM-4.7's layout: both read the same markup (whitespace between the tags is optional); a forced call
    writes this one's, the tags back to back."""
    name = "glm47"
    syntax = CallSyntax("", "", "", START, "", END, args="xml", param=(KEY, KEY_END + VALUE, VALUE_END))
