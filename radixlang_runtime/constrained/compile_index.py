"""One compile: (kind, text) -> regex -> outlines-core Index. Torch- and numpy-free (the compile
child imports this and nothing heavier).

Errors are ValueError with a message for the client: a schema outlines-core refuses ("json_schema:
..."), a regex it cannot build ("invalid regex: ..." with Python's position when it has one).
Resource limits (time, memory) are not enforced here: the caller runs this in a worker process.
"""

from __future__ import annotations

from typing import Any

from radixlang_runtime.constrained.regex_check import describe_compile_error
from radixlang_runtime.constrained.schema import schema_to_regex


def grammar_regex(kind: str, text: str) -> str:
    """The grammar as one regex: a checked regex as is, a canonical schema converted."""
    if kind == "regex":
        return text
    if kind == "json_schema":
        return schema_to_regex(text)
    raise ValueError(f"unknown grammar kind {kind!r}")


def build_index(kind: str, text: str, vocabulary: Any, sentinel: str) -> Any:
    """-> outlines_core.Index of `(?:R)S` over `vocabulary` (an outlines_core.Vocabulary that has the
    end sentinel S as a token; see vocab.py)."""
    from outlines_core import Index

    regex = grammar_regex(kind, text)
    try:
        return Index(f"(?:{regex})\\x{{{ord(sentinel):X}}}", vocabulary)
    except ValueError as e:
        msg = str(e)
        if "incompatible with the regex" in msg:
            raise ValueError(f"grammar cannot be generated with this tokenizer: {msg[:300]}") from None
        if kind == "regex":
            raise ValueError(describe_compile_error(regex, msg)) from None
        raise ValueError(f"json_schema: the regex built from it does not compile: {msg[:300]}") from None
