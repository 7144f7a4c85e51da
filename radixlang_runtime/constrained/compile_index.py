"""One compile: (kind, text) -> regex -> outlines-core Index. Torch- and numpy-free (the compile
child imports this and nothing heavier).

Errors are ValueError with a message for the client: a schema outlines-core refuses ("json_schema:
..."), a regex it cannot build ("invalid regex: ..." with Python's position when it has one), a
grammar no sequence of this vocabulary's tokens can spell ("... cannot be matched by this model's
tokens: ...", outlines-core's "incompatible with the regex ... no transitions" translated here, the one
place it surfaces), a grammar whose automaton is over automaton_size's bounds ("grammar too large: ...
needs more than N automaton states (limit N)", refused before outlines-core starts: what a regex bomb
gets, in well under a second instead of the time limit). Resource limits (time, memory) are not
enforced here: the caller runs this in a worker process.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from radixlang_runtime.constrained.automaton_size import check_automaton_size
from radixlang_runtime.constrained.regex_check import describe_compile_error
from radixlang_runtime.constrained.schema import schema_to_regex


def grammar_regex(kind: str, text: str) -> str:
    """The grammar as one regex: a checked regex as is, a canonical schema converted."""
    if kind == "regex":
        return text
    if kind == "json_schema":
        return schema_to_regex(text)
    raise ValueError(f"unknown grammar kind {kind!r}")


def _what(kind: str, text: str) -> str:
    """What an error message names: `regex '...'` or the kind (json_schema, ebnf, structural_tag)."""
    if kind != "regex":
        return kind
    return f"regex {text!r}" if len(text) <= 80 else f"regex {text[:77]!r}..."


def _unmatchable(kind: str, text: str, outlines_message: str) -> ValueError:
    """outlines-core's "The vocabulary provided is incompatible with the regex ... Found no transitions
    from state N, missing tokens corresponding to at least one of the following characters: [...]" in
    the client's words (it names no state of ours, and its "encoding issue" guess is not one here)."""
    chars = re.search(r"following characters: (\[.*?\])", outlines_message)
    if chars is None or chars.group(1) == "[]":
        detail = "part of it matches no character at all"
    else:
        detail = f"some text it allows can only go on with the bytes {chars.group(1)}, which no token spells"
    return ValueError(f"{_what(kind, text)} cannot be matched by this model's tokens: {detail}")


compile_error_subject = _what  # the name other backends' messages use

# a character as the regex writes it: \x{H} / \u{H} / \U{H} / \UHHHHHHHH, another escape, or itself
_CHAR = re.compile(r"\\(?:[xuU]\{([0-9A-Fa-f]{1,8})\}|U([0-9A-Fa-f]{8})|.)|(.)", re.S)


def _names(regex: str, ch: str) -> Optional[int]:
    """The position where `regex` writes the character `ch` (literally or as a hex escape), else None."""
    if ch not in regex and not re.search(rf"\\[xuU]\{{?0*{ord(ch):X}", regex, re.I):
        return None  # the common case, without the per-character scan below
    for m in _CHAR.finditer(regex):
        hexes = m.group(1) or m.group(2)
        if m.group(3) == ch or (hexes is not None and int(hexes, 16) == ord(ch)):
            return m.start()
    return None


def build_index(kind: str, text: str, vocabulary: Any, sentinel: str) -> Any:
    """-> outlines_core.Index of `(?:R)S` over `vocabulary` (an outlines_core.Vocabulary that has the
    end sentinel S as a token; see vocab.py)."""
    from outlines_core import Index

    regex = grammar_regex(kind, text)
    at = _names(regex, sentinel)
    if at is not None:  # S's lead byte is in no text token, so no token spells it; S would end R early
        raise ValueError(f"{_what(kind, text)} cannot be matched by this model's tokens: U+{ord(sentinel):X} "
                         f"(at position {at} of the regex) is a character no token spells")
    check_automaton_size(regex, _what(kind, text))  # a regex bomb is refused here, not after the time limit
    try:
        return Index(f"(?:{regex})\\x{{{ord(sentinel):X}}}", vocabulary)
    except ValueError as e:
        msg = str(e)
        if "incompatible with the regex" in msg:
            raise _unmatchable(kind, text, msg) from None
        if kind == "regex":
            raise ValueError(describe_compile_error(regex, msg)) from None
        raise ValueError(f"json_schema: the regex built from it does not compile: {msg[:300]}") from None
