"""GigaChat 3 tool calls: the reply's text, then its message separator and a `function call` role holding one
JSON call object, the end-of-sequence token after it:
  I'll check.<|message_sep|>\\n\\nfunction call<|role_sep|>\\n{"name": ..., "arguments": {...}}</s>
GigaChat 3.1 writes `<|function_call|>` in place of the separator and the role (SGLang's gigachat3 reads both).
Text before the group is content; `</s>` after the object is not. A group that is not a call (a separator
followed by other text) stays content. A forced tool_choice writes GigaChat 3's layout, each call its own
group. No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.base import DONE, INVALID, OPEN, CallScan, CallSyntax, GroupScan, ToolParser, \
    call_object_at
from radixlang_runtime.tool_parsers.json_scan import COMPLETE, skip_ws

MESSAGE_SEP, ROLE, INLINE, EOS = "<|message_sep|>", "function call<|role_sep|>", "<|function_call|>", "</s>"
OPENER = MESSAGE_SEP + "\n\n" + ROLE + "\n"  # as GigaChat 3's template writes a call message


class GigaChat3Parser(ToolParser):
    name = "gigachat3"
    markers = (MESSAGE_SEP, ROLE, INLINE)
    keeps_special_tokens = True  # the separators are special tokens
    syntax = CallSyntax(OPENER, OPENER, "", '{"name": "', '", "arguments": ', "}")

    def parse_group(self, text: str, final: bool) -> GroupScan:
        calls: list[CallScan] = []
        i = skip_ws(text, len(MESSAGE_SEP)) if text.startswith(MESSAGE_SEP) else 0
        for header in (ROLE, INLINE):
            if text.startswith(header, i):
                break
            if not final and header.startswith(text[i:]):  # the header is still coming (or nothing yet)
                return GroupScan(calls, OPEN, len(text))
        else:
            return GroupScan(calls, INVALID, i)
        status, end = call_object_at(text, skip_ws(text, i + len(header)), final, self.tool_names, calls,
                                     self.scan_at)
        if status != COMPLETE:
            return GroupScan(calls, status, end)
        j = skip_ws(text, end)
        if text.startswith(EOS, j):
            return GroupScan(calls, DONE, j + len(EOS))
        if not final and EOS.startswith(text[j:]):  # whitespace, or the start of </s>: not decided yet
            return GroupScan(calls, OPEN, len(text))
        return GroupScan(calls, DONE, end)  # other text follows the call: it is content
