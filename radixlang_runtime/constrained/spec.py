"""GrammarSpec: what a request constrains its output to. Torch-free, cheap, safe to run anywhere.

Kinds: "regex" (Rust regex syntax, whole-output match) and "json_schema" (canonical compact JSON,
key order kept). OpenAI's json_object is the schema {"type": "object"} (any JSON object); the DSL's
`dtype=int|float|bool|str` are the regexes in DTYPE_REGEX (SGLang's).

Invariant: constructing a GrammarSpec runs every Python-side check (regex_check / schema), so a spec
that exists is one a compiler may be handed; a ValueError names the problem (an HTTP 400). The
compiler can still refuse it (too large, outlines-core errors); that answer comes through the
GrammarHandle. `key` identifies the grammar for caching (with the tokenizer id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from radixlang_runtime.constrained.regex_check import DTYPE_REGEX, check_regex, dtype_name
from radixlang_runtime.constrained.schema import canonical_schema

GrammarKind = Literal["regex", "json_schema"]

JSON_OBJECT_SCHEMA = '{"type":"object"}'
__all__ = ["DTYPE_REGEX", "GrammarKind", "GrammarSpec", "JSON_OBJECT_SCHEMA", "spec_from_response_format",
           "spec_from_sampling"]

@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    source: str  # the regex as given, or the canonical schema JSON
    # what the compiler gets: the regex without outer anchors, or the canonical schema
    compile_text: str = field(default="", init=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind == "regex":
            object.__setattr__(self, "compile_text", check_regex(self.source))
        elif self.kind == "json_schema":
            if canonical_schema(self.source) != self.source:
                raise ValueError("a json_schema GrammarSpec must be built with GrammarSpec.from_json_schema")
            object.__setattr__(self, "compile_text", self.source)
        else:
            raise ValueError(f"unknown grammar kind {self.kind!r} (regex | json_schema)")

    @property
    def key(self) -> str:
        """Cache key (with the tokenizer id): what is compiled, so `^a$` and `a` share an entry."""
        return f"{self.kind}:{self.compile_text}"

    @classmethod
    def from_regex(cls, pattern: str) -> "GrammarSpec":
        return cls("regex", pattern)

    @classmethod
    def from_json_schema(cls, schema: Union[str, dict[str, Any]]) -> "GrammarSpec":
        return cls("json_schema", canonical_schema(schema))

    @classmethod
    def json_object(cls) -> "GrammarSpec":
        return cls("json_schema", JSON_OBJECT_SCHEMA)

    @classmethod
    def from_dtype(cls, dtype: str) -> "GrammarSpec":
        return cls("regex", DTYPE_REGEX[dtype_name(dtype)])

    def to_wire(self) -> list[str]:
        """[kind, source, compile_text]: the checked spec as a message carries it (from_wire rebuilds it)."""
        return [self.kind, self.source, self.compile_text]

    @classmethod
    def from_wire(cls, wire: list[str]) -> "GrammarSpec":
        """Trusted: a spec to_wire wrote after the sender's checks; nothing is checked or converted again."""
        spec = object.__new__(cls)
        for name, value in zip(("kind", "source", "compile_text"), wire, strict=True):
            object.__setattr__(spec, name, value)
        return spec

    def describe(self) -> str:
        s = self.source if len(self.source) <= 60 else self.source[:57] + "..."
        return f"{self.kind} {s}"


def spec_from_sampling(regex: Optional[str], json_schema: Optional[str]) -> Optional[GrammarSpec]:
    """sampling_params' regex / json_schema -> a spec (None when unconstrained); ValueError when invalid."""
    if regex is not None and json_schema is not None:
        raise ValueError("at most one of regex / json_schema may be set")
    if regex is not None:
        return GrammarSpec.from_regex(regex)
    if json_schema is not None:
        if not isinstance(json_schema, str):
            raise ValueError("json_schema must be a JSON string")
        return GrammarSpec.from_json_schema(json_schema)
    return None


def spec_from_response_format(response_format: Optional[dict[str, Any]]) -> Optional[GrammarSpec]:
    """OpenAI response_format -> a spec: {"type": "json_schema", "json_schema": {"name", "schema"}},
    {"type": "json_object"}, {"type": "text"} (None)."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise ValueError("response_format must be an object")
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return GrammarSpec.json_object()
    if kind == "json_schema":
        js = response_format.get("json_schema")
        if not isinstance(js, dict):
            raise ValueError("response_format.json_schema must be an object with a 'schema'")
        schema = js.get("schema", js.get("schema_"))
        if schema is None:
            return GrammarSpec.json_object()
        return GrammarSpec.from_json_schema(schema)
    raise ValueError(f"unsupported response_format type {kind!r} (text | json_object | json_schema)")
