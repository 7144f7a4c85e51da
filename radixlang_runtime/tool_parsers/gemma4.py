"""Gemma 4 tool calls: one call per pair of special tokens, calls back to back, text around them is content:
  <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2,hours:[9,12],opts:{metric:true}}<tool_call|>
Keys are bare (or, as vLLM also reads them, between `<|"|>`); a string value is the text between two `<|"|>`
tokens as written (no escapes); objects `{k:v,...}` and arrays `[v,...]` nest; any other value is bare text:
true / false, null / none / nil (any case) as None, a JSON number, else the text itself (vLLM's and SGLang's
gemma4 readings). A call's arguments stream one key at a time (a call commits at its first complete key,
or its "}"); a key written twice is not a call. The close token may be missing at the very end. The value
syntax has no CallSyntax, so tool_choice cannot force it. FunctionGemma writes the same calls in other tokens
(functiongemma.py). No torch."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Optional

from radixlang_runtime.tool_parsers.base import INVALID, OPEN, CallScan, GroupScan, ToolParser, closing
from radixlang_runtime.tool_parsers.json_scan import COMPLETE, PARTIAL, skip_ws
from radixlang_runtime.tool_parsers.markup import arguments_json, expect, known

START, END, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_NAME = re.compile(r"[\w\-.]+")
_KEY = re.compile(r"[^\s:,{}\[\]<]+")
_BARE = re.compile(r"[^,{}\[\]]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NULLS = ("null", "none", "nil")
_OPEN, _CLOSE = "{[", "}]"


class _ValueScanner:
    """A value from text[pos] to the first top-level `,` or `}`, read as the text grows (strings between `quote`
    tokens are opaque): scan(text) -> (COMPLETE, that index) / (PARTIAL, len) / (INVALID, index of an
    unbalanced bracket); value(text) is its reading, computed once."""

    def __init__(self, pos: int, quote: str = QUOTE):
        self.pos, self.i, self.depth, self.quoted, self.quote = pos, pos, [], False, quote
        self.done: Optional[tuple[str, int]] = None
        self._value: Optional[tuple[bool, Any]] = None

    def scan(self, text: str) -> tuple[str, int]:
        if self.done is not None:
            return self.done
        i, depth, quote = self.i, self.depth, self.quote
        while i < len(text):
            if text.startswith(quote, i):
                self.quoted = not self.quoted
                i += len(quote)
                continue
            if text[i] == quote[0] and quote.startswith(text[i:]):
                break  # resume at a token cut in two
            c = text[i]
            if self.quoted:
                pass
            elif c in _OPEN:
                depth.append(_CLOSE[_OPEN.index(c)])
            elif c in _CLOSE:
                if not depth:
                    self.done = (COMPLETE, i) if c == "}" else (INVALID, i)
                    return self.done
                if depth.pop() != c:
                    self.done = INVALID, i
                    return self.done
            elif c == "," and not depth:
                self.done = COMPLETE, i
                return self.done
            i += 1
        self.i = i
        return PARTIAL, len(text)

    def value(self, text: str) -> tuple[bool, Any]:
        if self._value is None:
            assert self.done is not None and self.done[0] == COMPLETE
            src = text[self.pos:self.done[1]]
            try:
                value, end = read_value(src, 0, self.quote)
                self._value = (skip_ws(src, end) == len(src), value)
            except (ValueError, RecursionError):
                self._value = False, None
        return self._value


def read_key(s: str, i: int, quote: str = QUOTE) -> tuple[str, int]:
    """A key and its ":" at s[i:] (whitespace first) -> (key, one past ":"); ValueError if malformed."""
    i = skip_ws(s, i)
    if s.startswith(quote, i):
        j = s.find(quote, i + len(quote))
        if j < 0:
            raise ValueError(i)
        key, k = s[i + len(quote):j], j + len(quote)
    else:
        m = _KEY.match(s, i)
        if m is None:
            raise ValueError(i)
        key, k = m.group(), m.end()
    k = skip_ws(s, k)
    if not s.startswith(":", k):
        raise ValueError(k)
    return key, k + 1


def read_value(s: str, i: int, quote: str = QUOTE) -> tuple[Any, int]:
    """One Gemma 4 value at s[i:] (whitespace first; strings between `quote` tokens) -> (its JSON value, one
    past it); ValueError if malformed (a key written twice included)."""
    i = skip_ws(s, i)
    if s.startswith(quote, i):
        j = s.find(quote, i + len(quote))
        if j < 0:
            raise ValueError(i)
        return s[i + len(quote):j], j + len(quote)
    if s.startswith("{", i) or s.startswith("[", i):
        obj = s[i] == "{"
        out: Any = {} if obj else []
        close = "}" if obj else "]"
        i = skip_ws(s, i + 1)
        if s.startswith(close, i):
            return out, i + 1
        while True:
            if obj:
                key, i = read_key(s, i, quote)
                if key in out:
                    raise ValueError(i)
                out[key], i = read_value(s, i, quote)
            else:
                item, i = read_value(s, i, quote)
                out.append(item)
            i = skip_ws(s, i)
            if s.startswith(close, i):
                return out, i + 1
            if not s.startswith(",", i):
                raise ValueError(i)
            i += 1
    m = _BARE.match(s, i)
    raw = m.group().strip()
    if not raw or quote in raw:
        raise ValueError(i)
    return bare_value(raw), m.end()


def bare_value(raw: str) -> Any:
    if raw in ("true", "false"):
        return raw == "true"
    if raw.lower() in _NULLS:
        return None
    if _NUMBER.fullmatch(raw):
        number = json.loads(raw)
        if math.isfinite(number):
            return number
    return raw


class Gemma4Parser(ToolParser):
    name = "gemma4"
    start, end, quote = START, END, QUOTE  # the call's tokens and the string delimiter (FunctionGemma's differ)
    markers = (START,)
    keeps_special_tokens = True
    syntax = None

    def parse_group(self, text: str, final: bool) -> GroupScan:
        calls: list[CallScan] = []
        quote = self.quote
        undecided = GroupScan(calls, INVALID if final else OPEN, len(text))
        st, i = expect(text, skip_ws(text, len(self.start)), "call:", final)
        if st != COMPLETE:
            return GroupScan(calls, st, i)
        m = _NAME.match(text, i)
        if m is None or m.end() == len(text):
            return undecided if i == len(text) or m is not None else GroupScan(calls, INVALID, i)
        if text[m.end()] != "{" or not known(self, m.group()):
            return GroupScan(calls, INVALID, m.end())
        items: list[tuple[str, Any]] = []
        call: Optional[CallScan] = None  # committed at its first complete key (streaming) or its "}"
        p = skip_ws(text, m.end() + 1)
        if p >= len(text):
            return undecided
        if text[p] != "}":
            while True:
                try:
                    key, q = read_key(text, p, quote)
                except ValueError:
                    return undecided if _key_pending(text, p, final, quote) else GroupScan(calls, INVALID, p)
                scanner = self.scanner(q, lambda pos: _ValueScanner(pos, quote))
                status, end = scanner.scan(text)
                if status == PARTIAL:
                    return undecided
                ok, value = scanner.value(text) if status == COMPLETE else (False, None)
                if not ok or any(key == k for k, _ in items):
                    return GroupScan(calls, INVALID, q)
                items.append((key, value))
                if call is None and not final:
                    call = CallScan(m.group(), "", False)
                    calls.append(call)
                if call is not None:
                    call.args = arguments_json(items, False)
                if text[end] == "}":
                    p = end
                    break
                p = end + 1
        if call is None:
            call = CallScan(m.group(), "", False)
            calls.append(call)
        call.args, call.complete = arguments_json(items, True), True
        return closing(text, p + 1, self.end, final, calls)


def _key_pending(text: str, p: int, final: bool, quote: str) -> bool:
    """A key at text[p:] that the text so far has not finished (more text may complete it)."""
    if final:
        return False
    i = skip_ws(text, p)
    rest = text[i:]
    if not rest or quote.startswith(rest):
        return True
    if rest.startswith(quote):
        j = text.find(quote, i + len(quote))
        return j < 0 or skip_ws(text, j + len(quote)) == len(text)
    m = _KEY.match(text, i)
    return m is not None and skip_ws(text, m.end()) == len(text)
