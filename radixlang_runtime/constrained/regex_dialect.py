"""Rust regex syntax (the runtime's dialect: outlines-core compiles with Rust's regex-syntax) -> Python `re`
syntax with the same character structure, for automaton_size.py, which reads regexes with Python's parser.

Translated: `\\x{H}` / `\\u{H}` / `\\U{H}` as `\\UHHHHHHHH`; each `\\p{..}` / `\\P{..}` / `\\pX` as an opaque
symbol of its own (a private-use codepoint from OPAQUE_BASE + 16 up: it overlaps no other character, so it
adds no nondeterminism); the flag `U` (swap greed: same language) dropped; a quantifier on a quantified
atom (`a{2}{3}`, `a{2}+`: Rust repeats again, Python refuses or reads possessive) as `(?:a{2}){3}`.
A `?` right after a quantifier stays the lazy marker (same language). Rust-only class syntax (nested
classes, `&&` / `--` / `~~`) raises Unanalysable: no verdict, the compile's own limits decide.
Torch-free, no state.
"""

from __future__ import annotations

import re

OPAQUE_BASE = 0x10FF00  # opaque symbols: private-use plane 16, its last 256 codepoints


class Unanalysable(Exception):
    """The check has no verdict (syntax it does not model, or the deadline): the compile decides."""


_UNSUPPORTED_CLASS = re.compile(r"&&|--|~~")
_FLAGS = re.compile(r"\(\?([a-zA-Z-]*)([:)])")
_QUANT = re.compile(r"[*+?]|\{\d*(,\d*)?\}")


def _escape(regex: str, i: int, opaque: dict[str, int]) -> tuple[str, int]:
    """regex[i] == '\\': (its Python spelling, index past it)."""
    e = regex[i + 1: i + 2]
    if e in ("x", "u", "U") and regex.startswith("{", i + 2):
        k = regex.find("}", i + 3)
        if k < 0:
            raise Unanalysable("unterminated escape")
        return f"\\U{int(regex[i + 3:k], 16):08X}", k + 1
    if e in ("p", "P"):
        k = regex.find("}", i + 3) + 1 if regex.startswith("{", i + 2) else i + 3
        if k <= 0:
            raise Unanalysable("unterminated \\p{")
        return f"\\U{opaque.setdefault(regex[i + 1:k], OPAQUE_BASE + 16 + len(opaque)):08X}", k
    return regex[i:i + 2], i + 2


def to_python_syntax(regex: str) -> str:
    """Rust regex syntax -> Python `re` syntax with the same character structure: `\\x{H}` / `\\u{H}` as
    `\\UHHHHHHHH`, each `\\p{..}` / `\\P{..}` / `\\pX` as an opaque symbol of its own, `(?U)` dropped, a
    quantifier on a quantified atom (`a{2}{3}`, which Python refuses) as `(?:a{2}){3}`.
    Raises Unanalysable for Rust-only class syntax (nested classes, set operations)."""
    out: list[str] = []
    opaque: dict[str, int] = {}
    groups: list[int] = []  # out index of each open group's '('
    # out index where the last atom starts; 0: no quantifier on it yet, 1: one (a `?` now is lazy), 2: lazy too
    atom, quantified = 0, 0
    i, n, in_class = 0, len(regex), False
    while i < n:
        c = regex[i]
        if c == "\\" and i + 1 < n:
            text, i = _escape(regex, i, opaque)
            if not in_class:
                atom, quantified = len(out), 0
            out.append(text)
            continue
        if in_class:
            if c == "[" or _UNSUPPORTED_CLASS.match(regex, i):
                raise Unanalysable("nested character class or class set operation")
            in_class = c != "]"
            out.append(c)
            i += 1
            continue
        q = _QUANT.match(regex, i) if c in "*+?{" else None
        if q:
            if quantified == 1 and c == "?":  # a lazy marker (Rust has no possessive `+`)
                out.append(c)
                quantified = 2
                i = q.end()
                continue
            else:
                if quantified:
                    out.insert(atom, "(?:")
                    out.append(")")
                out.append(q.group(0))
            quantified = 1
            i = q.end()
            continue
        m = _FLAGS.match(regex, i) if c == "(" else None
        if m:
            flags = m.group(1).replace("U", "")
            if m.group(2) == ":":
                groups.append(len(out))
            out.append(f"(?{flags}{m.group(2)}" if flags.strip("-") else "(?:" if m.group(2) == ":" else "(?:)")
            quantified = 0
            i = m.end()
            continue
        if c == "(":
            groups.append(len(out))
        elif c == ")" and groups:
            atom = groups.pop()
        elif c == "[":
            atom = len(out)
            j = i + 1 + (regex.startswith("^", i + 1))
            j += regex.startswith("]", j)  # a leading ']' is literal
            out.append(regex[i:j])
            i, in_class, quantified = j, True, 0
            continue
        elif c != "|":
            atom = len(out)
        quantified = 0
        out.append(c)
        i += 1
    return "".join(out)
