"""DeepSeek V3.2 tool calls: DSML markup (`｜DSML｜` inside each tag), text before the group is content:
  <｜DSML｜function_calls>\\n<｜DSML｜invoke name="NAME">\\n
  <｜DSML｜parameter name="KEY" string="true">TEXT</｜DSML｜parameter>\\n
  <｜DSML｜parameter name="KEY" string="false">JSON</｜DSML｜parameter>\\n...</｜DSML｜invoke>\\n...
  </｜DSML｜function_calls>
`string="true"`: the value is the text as written; `"false"`: JSON (text that is not JSON stays text, as
SGLang reads it). A call's body may instead be one JSON object of its arguments (SGLang reads that too); a
forced tool_choice writes that form, the arguments schema as JSON. The model sometimes writes its `invoke`
blocks without the wrapper (untagged): such a run of calls is read the same way, ending at the first text
that is not a call; a call with no arguments may close itself (`<｜DSML｜invoke name="NAME"/>`), as SGLang
reads both. DeepSeek V4 writes the same calls in a `<｜DSML｜tool_calls>` wrapper. No torch."""

from __future__ import annotations

import re
from typing import Any, Optional

from radixlang_runtime.tool_parsers.base import CallSyntax, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.invoke import NAME_END, Invokes, parse_invokes
from radixlang_runtime.tool_parsers.markup import read_json
from radixlang_runtime.tool_parsers.qwen3_coder import ParamFields

DSML = "｜DSML｜"
START, END = f"<{DSML}function_calls>", f"</{DSML}function_calls>"
INVOKE, INVOKE_END = f'<{DSML}invoke name="', f"</{DSML}invoke>"
PARAM, PARAM_END = f'<{DSML}parameter name="', f"</{DSML}parameter>"
V4_START, V4_END = f"<{DSML}tool_calls>", f"</{DSML}tool_calls>"
_KEY = re.compile(r'([^\s<>"]+)"\s+string="(true|false)')  # the text before `">`


class DsmlFields(ParamFields):
    """A key's text is `KEY" string="true|false`: the flag says whether the value is text or JSON."""

    def key(self, text: str) -> Optional[tuple[str, str]]:
        m = _KEY.fullmatch(text)
        return (m.group(1), m.group(2)) if m else None

    def value(self, parser: ToolParser, name: str, key: str, flag: str, raw: str) -> Any:
        if flag == "true":
            return raw
        value = read_json(raw)
        return raw if value is ValueError else value


def _invokes(start: str, end: str) -> Invokes:
    return Invokes(start, end, INVOKE, INVOKE_END, PARAM, PARAM_END, json_body=True, self_close=True)


class DeepSeekV32Parser(ToolParser):
    name = "deepseekv32"
    markers = (START, INVOKE)  # a group in its wrapper, or untagged calls
    keeps_special_tokens = True
    invokes = _invokes(START, END)
    untagged = _invokes("", "")
    syntax = CallSyntax(START + "\n", "", END, INVOKE, NAME_END + "\n", "\n" + INVOKE_END + "\n")
    fields = DsmlFields()

    def parse_group(self, text: str, final: bool) -> GroupScan:
        wrapped = text.startswith(self.invokes.open)
        return parse_invokes(self, self.invokes if wrapped else self.untagged, self.fields, text, final)


class DeepSeekV4Parser(DeepSeekV32Parser):
    """DeepSeek V4: V3.2's calls in a `<｜DSML｜tool_calls>` wrapper (vLLM's deepseek_v4, SGLang's deepseekv4)."""

    name = "deepseekv4"
    markers = (V4_START, INVOKE)
    invokes = _invokes(V4_START, V4_END)
    syntax = CallSyntax(V4_START + "\n", "", V4_END, INVOKE, NAME_END + "\n", "\n" + INVOKE_END + "\n")
