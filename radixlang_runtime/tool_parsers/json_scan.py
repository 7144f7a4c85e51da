"""Incremental JSON: where a value ends, or whether the text so far can still become one (no torch).

scan_json(text, pos) reads one JSON value (RFC 8259, strict: no NaN, no trailing commas) starting at
pos (leading whitespace skipped) and says:
  COMPLETE  the value ends at `end` (text[start:end] json.loads to it),
  PARTIAL   text[start:] is a viable prefix of some value (more text may complete it),
  INVALID   no continuation can make a value: `end` is the offending index.
For a top-level object it also records its members (key, value span), so a tool-call parser can see
`"name"` and where `"arguments"` begins before the object closes. JsonScanner continues a scan as the
text grows (streaming). Pure Python, linear in the text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Optional

COMPLETE, PARTIAL, INVALID = "complete", "partial", "invalid"
_WS = " \t\n\r"
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_PREFIX = re.compile(r"-?(?:0|[1-9][0-9]*)?(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?")
_NUMBER_CHARS = set("0123456789+-.eE")
_LITERALS = ("true", "false", "null")
_HEX = set("0123456789abcdefABCDEF")


@dataclass
class Member:
    """One member of the top-level object: its key, where its value starts, and where it ends (None
    while the value is unfinished)."""
    key: str
    start: int  # -1 until the value's first character is read
    end: Optional[int] = None


@dataclass
class JsonScan:
    status: str  # COMPLETE / PARTIAL / INVALID
    start: int  # the value's first character (after leading whitespace)
    end: int  # COMPLETE: one past the value; PARTIAL: len(text); INVALID: the offending index
    members: list[Member] = field(default_factory=list)  # the top-level object's members, in order


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _string_end(text: str, i: int, resume: Optional[int] = None) -> tuple[str, int, int]:
    """text[i] == '"' -> (COMPLETE, one past the closing quote, _) / (PARTIAL, len, where to resume: every
    character before it is checked) / (INVALID, index, _). resume: a previous PARTIAL's resume index."""
    i = i + 1 if resume is None else resume
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return COMPLETE, i + 1, 0
        if c == "\\":
            if i + 1 >= n:
                return PARTIAL, n, i
            e = text[i + 1]
            if e == "u":
                digits = text[i + 2:i + 6]
                if not all(d in _HEX for d in digits):
                    return INVALID, i, 0
                if len(digits) < 4:
                    return PARTIAL, n, i
                i += 6
                continue
            if e not in '"\\/bfnrt':
                return INVALID, i, 0
            i += 2
            continue
        if c < " ":
            return INVALID, i, 0
        i += 1
    return PARTIAL, n, n


def _scalar_end(text: str, i: int) -> tuple[str, int]:
    """A number or a literal starting at text[i]."""
    c = text[i]
    if c in _NUMBER_CHARS:
        j = i
        while j < len(text) and text[j] in _NUMBER_CHARS:
            j += 1
        if j == len(text):  # the number may go on
            return (PARTIAL, j) if _NUMBER_PREFIX.fullmatch(text, i, j) else (INVALID, i)
        m = _NUMBER.match(text, i, j)
        return (COMPLETE, j) if m and m.end() == j else (INVALID, i)
    for lit in _LITERALS:
        if text.startswith(lit, i):
            return COMPLETE, i + len(lit)
        if lit.startswith(text[i:]):
            return PARTIAL, len(text)
    return INVALID, i


class JsonScanner:
    """scan_json over a growing text: scan(text) again after text grew (same prefix) continues where the
    last call stopped (inside a long string too), so streaming a value costs linear time overall."""

    def __init__(self, pos: int = 0):
        self.pos = pos
        self.start: Optional[int] = None
        self.i = 0  # the next character to read, or the start of the token left unfinished
        self.resume: Optional[int] = None  # inside that token when it is a string: checked up to here
        self.stack: list[str] = []  # open containers, "{" or "["
        self.expect = "value"  # value / key / key_or_close / colon / comma_or_close / value_or_close
        self.key = ""
        self.members: list[Member] = []
        self.final: Optional[JsonScan] = None  # COMPLETE / INVALID: no later text changes them

    def _stop(self, status: str, end: int) -> JsonScan:
        assert self.start is not None
        result = JsonScan(status, self.start, end, self.members)
        if status != PARTIAL:
            self.final = result
        return result

    def scan(self, text: str) -> JsonScan:
        if self.final is not None:
            return self.final
        if self.start is None:
            self.start = skip_ws(text, self.pos)
            if self.start >= len(text):
                self.start = None
                return JsonScan(PARTIAL, len(text), len(text))
            self.i = self.start
        n = len(text)
        while True:
            i = self.i = skip_ws(text, self.i)
            if i >= n:
                return self._stop(PARTIAL, n)
            c, expect = text[i], self.expect
            if expect in ("key", "key_or_close"):
                if c == "}" and expect == "key_or_close":
                    expect = "close"
                elif c == '"':
                    st, j, self.resume = _string_end(text, i, self.resume)
                    if st != COMPLETE:
                        return self._stop(st, j)
                    self.key, self.i, self.expect, self.resume = json.loads(text[i:j]), j, "colon", None
                    continue
                else:
                    return self._stop(INVALID, i)
            elif expect == "colon":
                if c != ":":
                    return self._stop(INVALID, i)
                self.i, self.expect = i + 1, "value"
                if len(self.stack) == 1:
                    self.members.append(Member(self.key, -1))  # start: at the value's first character
                continue
            elif expect == "comma_or_close":
                if c == ",":
                    self.i, self.expect = i + 1, "key" if self.stack[-1] == "{" else "value"
                    continue
                if c != ("}" if self.stack[-1] == "{" else "]"):
                    return self._stop(INVALID, i)
                expect = "close"
            elif expect == "value_or_close" and c == "]":
                expect = "close"
            if expect in ("value", "value_or_close") and len(self.stack) == 1 and self.members \
                    and self.members[-1].start < 0:
                self.members[-1].start = i
            if expect == "close":  # text[i] closes the innermost container
                self.stack.pop()
                i += 1
            elif c in "{[":
                self.stack.append(c)
                self.i, self.expect = i + 1, "key_or_close" if c == "{" else "value_or_close"
                continue
            else:  # a scalar value
                if c == '"':
                    st, j, self.resume = _string_end(text, i, self.resume)
                else:
                    st, j = _scalar_end(text, i)
                if st != COMPLETE:
                    return self._stop(st, j)
                i, self.resume = j, None
            # a value just ended (a scalar, or the container closed at i - 1)
            self.i = i
            if len(self.stack) == 1 and self.stack[0] == "{" and self.members and self.members[-1].end is None:
                self.members[-1].end = i
            if not self.stack:
                return self._stop(COMPLETE, i)
            self.expect = "comma_or_close"


def scan_json(text: str, pos: int = 0) -> JsonScan:
    return JsonScanner(pos).scan(text)
