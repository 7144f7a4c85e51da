"""Incremental JSON: where a value ends, or whether the text so far can still become one (no torch).

scan_json(text, pos) reads one JSON value (RFC 8259, strict: no NaN, no trailing commas) starting at
pos (leading whitespace skipped) and says:
  COMPLETE  the value ends at `end` (text[start:end] json.loads to it),
  PARTIAL   text[start:] is a viable prefix of some value (more text may complete it),
  INVALID   no continuation can make a value: `end` is the offending index.
For a top-level object it also records its members (key, value span), so a tool-call parser can see
`"name"` and where `"arguments"` begins before the object closes. Pure Python, linear in the text.
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
    start: int
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


def _string_end(text: str, i: int) -> tuple[str, int]:
    """text[i] == '"': (COMPLETE, one past the closing quote) / (PARTIAL, len) / (INVALID, index)."""
    i += 1
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return COMPLETE, i + 1
        if c == "\\":
            if i + 1 >= n:
                return PARTIAL, n
            e = text[i + 1]
            if e == "u":
                digits = text[i + 2:i + 6]
                if not all(d in _HEX for d in digits):
                    return INVALID, i
                if len(digits) < 4:
                    return PARTIAL, n
                i += 6
                continue
            if e not in '"\\/bfnrt':
                return INVALID, i
            i += 2
            continue
        if c < " ":
            return INVALID, i
        i += 1
    return PARTIAL, n


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


def scan_json(text: str, pos: int = 0) -> JsonScan:
    start = skip_ws(text, pos)
    members: list[Member] = []
    # stack of containers: "{" or "["; expect: what may come next
    stack: list[str] = []
    expect = "value"  # value / key / key_or_close / colon / comma_or_close / value_or_close
    i, n = start, len(text)
    key = ""
    while True:
        i = skip_ws(text, i)
        if i >= n:
            return JsonScan(PARTIAL, start, n, members)
        c = text[i]
        if expect in ("key", "key_or_close"):
            if c == "}" and expect == "key_or_close":
                expect = "close"
            elif c == '"':
                st, j = _string_end(text, i)
                if st != COMPLETE:
                    return JsonScan(st, start, j, members)
                key = json.loads(text[i:j])
                i, expect = j, "colon"
                continue
            else:
                return JsonScan(INVALID, start, i, members)
        elif expect == "colon":
            if c != ":":
                return JsonScan(INVALID, start, i, members)
            i, expect = i + 1, "value"
            if len(stack) == 1:
                members.append(Member(key, skip_ws(text, i)))
            continue
        elif expect == "comma_or_close":
            if c == ",":
                i, expect = i + 1, "key" if stack[-1] == "{" else "value"
                continue
            if c != ("}" if stack[-1] == "{" else "]"):
                return JsonScan(INVALID, start, i, members)
            expect = "close"
        elif expect == "value_or_close" and c == "]":
            expect = "close"
        if expect == "close":  # text[i] closes the innermost container
            stack.pop()
            i += 1
        elif c in "{[":
            stack.append(c)
            i += 1
            expect = "key_or_close" if c == "{" else "value_or_close"
            continue
        else:  # a scalar value
            st, j = _string_end(text, i) if c == '"' else _scalar_end(text, i)
            if st != COMPLETE:
                return JsonScan(st, start, j, members)
            i = j
        # a value just ended (a scalar, or the container closed at i - 1)
        if len(stack) == 1 and members and members[-1].end is None and stack[0] == "{":
            members[-1].end = i
        if not stack:
            return JsonScan(COMPLETE, start, i, members)
        expect = "comma_or_close"
