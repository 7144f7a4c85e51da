"""Step3 tool calls: special tokens (full-width bars) around StepTML invocations, text before is content:
  <｜tool_calls_begin｜>\\n<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="NAME">\\n
  <steptml:parameter name="KEY">VALUE</steptml:parameter>\\n...</steptml:invoke><｜tool_call_end｜>\\n...
  <｜tool_calls_end｜>
A value's surrounding ASCII whitespace is layout (SGLang strips it; other characters str.strip() would take,
such as \\x1f, stay); the rest becomes the JSON value the tool's parameters schema types it as
(markup.typed_value). A forced tool_choice writes that layout with the schema's
properties in order, a string parameter's value as text without `<`, others as JSON. No torch."""

from __future__ import annotations

from typing import Any

from radixlang_runtime.tool_parsers.base import CallSyntax, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.invoke import NAME_END, Invokes, parse_invokes
from radixlang_runtime.tool_parsers.markup import param_schema, typed_value
from radixlang_runtime.tool_parsers.qwen3_coder import ParamFields

START, END = "<｜tool_calls_begin｜>", "<｜tool_calls_end｜>"
CALL_OPEN, CALL_CLOSE = "<｜tool_call_begin｜>function<｜tool_sep｜>", "<｜tool_call_end｜>"
INVOKE, INVOKE_END = '<steptml:invoke name="', "</steptml:invoke>"
PARAM, PARAM_END = '<steptml:parameter name="', "</steptml:parameter>"
LAYOUT = " \t\n\r\x0b\x0c"


class StrippedFields(ParamFields):
    def value(self, parser: ToolParser, name: str, key: str, flag: str, raw: str) -> Any:
        return typed_value(raw.strip(LAYOUT), param_schema(parser, name, key))


class Step3Parser(ToolParser):
    name = "step3"
    markers = (START,)
    keeps_special_tokens = True
    invokes = Invokes(START, END, INVOKE, INVOKE_END, PARAM, PARAM_END, call_open=CALL_OPEN, call_close=CALL_CLOSE)
    syntax = CallSyntax(START + "\n", "\n", "\n" + END, CALL_OPEN + INVOKE, NAME_END + "\n",
                        INVOKE_END + CALL_CLOSE, args="xml", param=(PARAM, NAME_END, PARAM_END + "\n"))
    fields = StrippedFields()

    def parse_group(self, text: str, final: bool) -> GroupScan:
        return parse_invokes(self, self.invokes, self.fields, text, final)
