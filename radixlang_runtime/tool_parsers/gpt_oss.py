"""gpt-oss tool calls (OpenAI's harmony format; its markup is special tokens the detokenizer must keep).
The output is messages, the first one's `<|start|>assistant` in the prompt:
  <|channel|>analysis<|message|>...<|end|>                           reasoning: not content (dropped here:
                                                                     this format has no reasoning parser yet)
  <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
                                                                     a call (`to=` may sit in the role header)
  <|start|>assistant<|channel|>final<|message|>TEXT<|return|>        content (commentary without a recipient too)
The first message's role header may go on in the output (` to=functions.NAME<|channel|>...`, as openai-harmony
renders a call: the prompt ends with its `<|start|>assistant`).
Recipients other than `functions.*` (built-in browser / python tools) are not read: such a message stays text.
Forced calls are written `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`.
No torch."""

from __future__ import annotations

import re

from radixlang_runtime.tool_parsers.base import DONE, INVALID, OPEN, CallScan, CallSyntax, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.json_scan import COMPLETE
from radixlang_runtime.tool_parsers.markup import expect, json_args_at, known, read_until

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
END, RETURN, CALL = "<|end|>", "<|return|>", "<|call|>"
HEADER_TAIL = " to="  # the output's first message addressed in its role header, `<|start|>assistant` in the prompt
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CONTENT_CHANNELS = ("final", "commentary")
NO_LIMIT = 1 << 60


class GptOssParser(ToolParser):
    name = "gpt-oss"
    markers = (START, CHANNEL, END, RETURN, CALL)
    keeps_special_tokens = True
    syntax = CallSyntax("", START + "assistant", "", CHANNEL + "commentary to=functions.",
                        " <|constrain|>json" + MESSAGE, CALL)

    def find_group(self, text: str) -> tuple[int, int]:
        if self.at_output_start and text.startswith(HEADER_TAIL):
            return 0, len(text)
        if self.at_output_start and HEADER_TAIL.startswith(text):
            return -1, 0  # undecided
        return super().find_group(text)

    def parse_group(self, text: str, final: bool) -> GroupScan:
        calls: list[CallScan] = []
        for mark in (END, RETURN, CALL):  # a message's end: not content
            if text.startswith(mark):
                return GroupScan(calls, DONE, len(mark))
        role, i = "", 0
        if text.startswith(START) or text.startswith(HEADER_TAIL):
            begin = len(START) if text.startswith(START) else 0
            st, i = read_until(text, begin, CHANNEL, final)
            if st != COMPLETE:
                return GroupScan(calls, st, i)
            role = text[begin:i] if begin else "assistant" + text[:i]
            if role.split()[:1] != ["assistant"]:
                return GroupScan(calls, INVALID, begin)
        st, j = expect(text, i, CHANNEL, final)
        if st != COMPLETE:
            return GroupScan(calls, st, j)
        st, k = read_until(text, j, MESSAGE, final)
        if st != COMPLETE:
            return GroupScan(calls, st, k)
        header = text[j:k]
        body = k + len(MESSAGE)
        to = _RECIPIENT.search(role + " " + header)
        channel = header.split()[0] if header.split() else ""
        if to is not None:
            name = to.group(1).removeprefix("functions.")
            if not to.group(1).startswith("functions.") or not known(self, name):
                return GroupScan(calls, INVALID, j)
            st, end = json_args_at(self, text, body, final, name, calls)
            if st != COMPLETE:
                return GroupScan(calls, st, end)
            st, e = expect(text, end, CALL, final)
            if st == INVALID and end == len(text) and final:  # stopped on <|call|>
                return GroupScan(calls, DONE, end)
            return GroupScan(calls, DONE if st == COMPLETE else st, e)
        if channel in _CONTENT_CHANNELS:
            return GroupScan(calls, DONE, body)  # its text is content; its end marker is a group of its own
        if channel == "analysis":
            st, e = read_until(text, body, END, final, NO_LIMIT)
            if st == COMPLETE:
                return GroupScan(calls, DONE, e + len(END))
            return GroupScan(calls, DONE if final else OPEN, len(text))
        return GroupScan(calls, INVALID, j)
