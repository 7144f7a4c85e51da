"""The `<invoke name="F">` layout MiniMax-M2, DeepSeek V3.2 and Step3 share: a group holds calls, each call named
parameters (or, where the format allows it, one JSON object), text around a group is content:
  OPEN (CALL_OPEN INVOKE F">  (PARAM KEY">VALUE PARAM_END)*  INVOKE_END CALL_CLOSE)+ CLOSE
(CALL_OPEN / CALL_CLOSE: Step3's special tokens around each call; whitespace between the pieces.) CLOSE may be
missing at the very end (the model stopped on it). An untagged group (OPEN and CLOSE empty: DeepSeek's calls
written without their wrapper) is a run of calls that ends at the first text that is not one. Where the format
allows it, a call with no arguments may close itself: `INVOKE F"/>`. Kimi K3 writes a call's header and a
parameter's key as attributes up to a separator token (Invokes.header_end / key_end). The formats differ in their tags
and in how a call's header, a parameter's key text and value read (qwen3_coder.ParamFields); a call streams one
parameter at a time. No torch."""

from __future__ import annotations

import re
from dataclasses import dataclass

from radixlang_runtime.tool_parsers.base import DONE, INVALID, OPEN, CallScan, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.json_scan import COMPLETE, skip_ws
from radixlang_runtime.tool_parsers.markup import expect, json_args_at, known, read_until
from radixlang_runtime.tool_parsers.qwen3_coder import ParamFields, xml_params

_NAME = re.compile(r'[^\s<>"]+')
NAME_END = '">'  # ends a call's name and a parameter's key
SELF_CLOSE = '"/>'  # ends a call with no arguments, where Invokes.self_close allows it


@dataclass(frozen=True)
class Invokes:
    open: str
    close: str
    invoke: str  # up to the call's name: `<invoke name="`
    invoke_end: str
    param: str  # up to a parameter's key
    param_end: str
    json_body: bool = False  # a call's arguments may be one JSON object instead of parameters
    call_open: str = ""  # before a call's INVOKE
    call_close: str = ""  # after its INVOKE_END
    self_close: bool = False  # `INVOKE F"/>` is a call with no arguments
    header_end: str = ""  # set: a call's header is attributes up to it, read by ParamFields.call_name
    key_end: str = NAME_END  # ends a parameter's key text


def parse_invokes(parser: ToolParser, m: Invokes, fields: ParamFields, text: str, final: bool) -> GroupScan:
    """text starts at m.open: its calls, then m.close. The complete calls are kept (the parser's scanner cache)
    and the next delta resumes after them: a streamed group costs linear time."""
    state = parser._scanners.setdefault(("invokes", 0), [len(m.open), []])  # [resume index, complete calls]
    i, calls = state[0], list(state[1])
    while True:
        i = skip_ws(text, i)
        if calls and i == len(text):
            return GroupScan(calls, DONE if final else OPEN, i)
        first = m.call_open or m.invoke
        if not m.close:  # untagged: the calls end where the text is not (the start of) another one
            if calls and not (text.startswith(first, i) or (not final and first.startswith(text[i:]))):
                return GroupScan(calls, DONE, i)
        else:
            st, j = expect(text, i, m.close, final)
            if st == COMPLETE and calls:
                return GroupScan(calls, DONE, j)
            if st == OPEN and calls and not text.startswith(first[:len(text) - i], i):
                return GroupScan(calls, OPEN, j)
        if m.call_open:
            st, i = expect(text, i, m.call_open, final)
            if st != COMPLETE:
                return GroupScan(calls, st, i)
            i = skip_ws(text, i)
        st, j = expect(text, i, m.invoke, final)
        if st != COMPLETE:
            return GroupScan(calls, st, j)
        st, k = read_until(text, j, m.header_end or '"', final)
        if st != COMPLETE:
            return GroupScan(calls, st, k)
        name = fields.call_name(text[j:k]) if m.header_end else text[j:k]
        if name is None or not _NAME.fullmatch(name) or not known(parser, name):
            return GroupScan(calls, INVALID, j)
        st, body = (COMPLETE, k + len(m.header_end)) if m.header_end else _name_end(text, k, final, m.self_close)
        if st != COMPLETE:
            return GroupScan(calls, st, body)
        body = skip_ws(text, body)
        if m.self_close and text.startswith(SELF_CLOSE, k):
            calls.append(CallScan(name, "{}", True))
            st, end = COMPLETE, k + len(SELF_CLOSE)
        elif m.json_body and text.startswith("{", body):
            st, end = json_args_at(parser, text, body, final, name, calls)
            if st == COMPLETE:
                st, end = expect(text, skip_ws(text, end), m.invoke_end, final)
        else:
            st, end = xml_params(parser, text, body, final, name, calls,
                                 (m.param, m.key_end, "", m.param_end, m.invoke_end), fields=fields)
        if st == COMPLETE and m.call_close:
            st, end = expect(text, skip_ws(text, end), m.call_close, final)
        if st != COMPLETE:
            return GroupScan(calls, st, end)
        i = state[0] = end
        state[1] = list(calls)


def _name_end(text: str, k: int, final: bool, self_close: bool) -> tuple[str, int]:
    """After a call's name (text[k] is its closing quote): `">` or, where allowed, `"/>` -> (COMPLETE, one past
    it) / (OPEN, len) / (INVALID, k)."""
    for lit in (NAME_END, SELF_CLOSE) if self_close else (NAME_END,):
        st, end = expect(text, k, lit, final)
        if st != INVALID:
            return st, end
    return INVALID, k
