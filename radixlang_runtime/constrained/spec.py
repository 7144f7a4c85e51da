"""GrammarSpec: what a request constrains its output to. Torch-free, cheap, safe to run anywhere.

Kinds: "regex" (Rust regex syntax, whole-output match), "json_schema" (canonical compact JSON,
key order kept), "ebnf" (GBNF-style EBNF with a `root` rule, SGLang's `ebnf` field) and
"structural_tag" (canonical JSON {"structures": [{"begin", "schema", "end"}], "triggers": [...]},
the SGLang/vLLM response_format shape). ebnf and structural_tag need a context-free backend
(--grammar-backend xgrammar | llguidance, backends.py); outlines refuses them by name.
OpenAI's json_object is the schema {"type": "object"} (any JSON object); the DSL's
`dtype=int|float|bool|str` are the regexes in DTYPE_REGEX (SGLang's).

Invariant: constructing a GrammarSpec runs every Python-side check (regex_check / schema), so a spec
that exists is one a compiler may be handed; a ValueError names the problem (an HTTP 400). The
compiler can still refuse it (too large, outlines-core errors); that answer comes through the
GrammarHandle. `key` identifies the grammar for caching (with the tokenizer id).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from radixlang_runtime.constrained.regex_check import DTYPE_REGEX, check_regex, dtype_name
from radixlang_runtime.constrained.schema import canonical_schema

GrammarKind = Literal["regex", "json_schema", "ebnf", "structural_tag"]
GRAMMAR_FIELDS = ("regex", "json_schema", "ebnf", "structural_tag")  # sampling_params fields, at most one set
MAX_EBNF_CHARS = 1 << 18
MAX_STRUCTURES = 64

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
        elif self.kind == "ebnf":
            object.__setattr__(self, "compile_text", check_ebnf(self.source))
        elif self.kind == "structural_tag":
            if canonical_structural_tag(self.source) != self.source:
                raise ValueError("a structural_tag GrammarSpec must be built with GrammarSpec.from_structural_tag")
            object.__setattr__(self, "compile_text", self.source)
        else:
            raise ValueError(f"unknown grammar kind {self.kind!r} (regex | json_schema | ebnf | structural_tag)")

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
    def from_ebnf(cls, grammar: str) -> "GrammarSpec":
        return cls("ebnf", grammar)

    @classmethod
    def from_structural_tag(cls, tag: Union[str, dict[str, Any]]) -> "GrammarSpec":
        return cls("structural_tag", canonical_structural_tag(tag))

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


def check_ebnf(grammar: Any) -> str:
    """Python-side checks of an EBNF grammar (its syntax is the backend's: errors name line and column)."""
    if not isinstance(grammar, str) or not grammar.strip():
        raise ValueError("ebnf must be a non-empty string (GBNF-style EBNF with a `root` rule)")
    if len(grammar) > MAX_EBNF_CHARS:
        raise ValueError(f"ebnf too long: {len(grammar)} characters (limit {MAX_EBNF_CHARS})")
    if "root" not in grammar:
        raise ValueError("ebnf has no `root` rule (the rule the whole output must match)")
    return grammar


def canonical_structural_tag(tag: Union[str, dict[str, Any]]) -> str:
    """{"structures": [{"begin": str, "schema": object, "end": str}, ...], "triggers": [str, ...]} (a JSON
    string or a dict; a "type" key is dropped) -> compact JSON; each schema passes schema.py's checks."""
    if isinstance(tag, str):
        try:
            tag = json.loads(tag)
        except (json.JSONDecodeError, RecursionError) as e:
            raise ValueError(f"structural_tag is not valid JSON: {e}") from None
    if not isinstance(tag, dict):
        raise ValueError("structural_tag must be an object with 'structures' and 'triggers'")
    extra = sorted(set(tag) - {"type", "structures", "triggers"})
    if extra:
        raise ValueError(f"structural_tag: unknown field(s) {', '.join(extra)} (structures | triggers)")
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not isinstance(structures, list) or not 1 <= len(structures) <= MAX_STRUCTURES:
        raise ValueError(f"structural_tag.structures must be a list of 1 to {MAX_STRUCTURES} objects")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise ValueError("structural_tag.triggers must be a non-empty list of non-empty strings")
    out = []
    for i, st in enumerate(structures):
        if not isinstance(st, dict) or set(st) != {"begin", "schema", "end"}:
            raise ValueError(f"structural_tag.structures[{i}] must be an object with exactly begin, schema, end")
        if not isinstance(st["begin"], str) or not isinstance(st["end"], str) or not st["begin"]:
            raise ValueError(f"structural_tag.structures[{i}]: begin (non-empty) and end must be strings")
        if not any(st["begin"].startswith(t) for t in triggers):
            raise ValueError(f"structural_tag.structures[{i}].begin {st['begin']!r} starts with no trigger")
        try:
            schema = json.loads(canonical_schema(st["schema"]))
        except ValueError as e:
            raise ValueError(f"structural_tag.structures[{i}].schema: {e}") from None
        out.append({"begin": st["begin"], "schema": schema, "end": st["end"]})
    return json.dumps({"structures": out, "triggers": triggers}, separators=(",", ":"), ensure_ascii=False)


def spec_from_sampling(regex: Optional[str], json_schema: Optional[str], ebnf: Optional[str] = None,
                       structural_tag: Optional[str] = None) -> Optional[GrammarSpec]:
    """sampling_params' regex / json_schema / ebnf / structural_tag -> a spec (None when unconstrained);
    ValueError when invalid."""
    given = [n for n, v in zip(GRAMMAR_FIELDS, (regex, json_schema, ebnf, structural_tag)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"at most one of {' / '.join(GRAMMAR_FIELDS)} may be set, got {', '.join(given)}")
    if regex is not None:
        return GrammarSpec.from_regex(regex)
    if json_schema is not None:
        if not isinstance(json_schema, str):
            raise ValueError("json_schema must be a JSON string")
        return GrammarSpec.from_json_schema(json_schema)
    if ebnf is not None:
        return GrammarSpec.from_ebnf(ebnf)
    if structural_tag is not None:
        if not isinstance(structural_tag, str):
            raise ValueError("structural_tag must be a JSON string")
        return GrammarSpec.from_structural_tag(structural_tag)
    return None


def spec_from_response_format(response_format: Optional[dict[str, Any]]) -> Optional[GrammarSpec]:
    """OpenAI response_format -> a spec: {"type": "json_schema", "json_schema": {"name", "schema"}},
    {"type": "json_object"}, {"type": "structural_tag", "structures", "triggers"}, {"type": "text"} (None)."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise ValueError("response_format must be an object")
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return GrammarSpec.json_object()
    if kind == "structural_tag":
        return GrammarSpec.from_structural_tag(response_format)
    if kind == "json_schema":
        js = response_format.get("json_schema")
        if not isinstance(js, dict):
            raise ValueError("response_format.json_schema must be an object with a 'schema'")
        schema = js.get("schema", js.get("schema_"))
        if schema is None:
            return GrammarSpec.json_object()
        return GrammarSpec.from_json_schema(schema)
    raise ValueError(f"unsupported response_format type {kind!r} (text | json_object | json_schema | structural_tag)")


_REGEX_META = set("\\.+*?()|[]{}^$")  # special outside a class in every backend's dialect (no x mode)
STRUCTURED_OUTPUTS_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
# vLLM's options that leave the constraint as is at these values (disable_fallback: this server never falls
# back to another backend); any other value is refused by name
_STRUCTURED_OUTPUTS_OFF = {"disable_fallback": (True, False), "disable_any_whitespace": (False,),
                           "disable_additional_properties": (False,), "whitespace_pattern": ()}


def choice_regex(choices: Any, where: str = "choice") -> str:
    """A list of strings -> the regex that matches exactly one of them."""
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError(f"{where} must be a non-empty list of non-empty strings")
    return "(?:" + "|".join("".join("\\" + ch if ch in _REGEX_META else ch for ch in c) for c in choices) + ")"


def spec_from_structured_outputs(so: Optional[dict[str, Any]]) -> Optional[GrammarSpec]:
    """vLLM's `structured_outputs` {json | regex | choice | grammar | json_object | structural_tag, exactly one;
    disable_fallback, disable_any_whitespace, disable_additional_properties, whitespace_pattern} -> a spec.
    grammar is GBNF-style EBNF (the ebnf kind); choice is the regex of its alternatives."""
    if so is None:
        return None
    if not isinstance(so, dict):
        raise ValueError("structured_outputs must be an object")
    if unknown := sorted(set(so) - set(STRUCTURED_OUTPUTS_KINDS) - set(_STRUCTURED_OUTPUTS_OFF)):
        raise ValueError(f"unknown field(s) in structured_outputs: {', '.join(unknown)}")
    for name, off in _STRUCTURED_OUTPUTS_OFF.items():
        if so.get(name) is not None and so[name] not in off:
            raise ValueError(f"structured_outputs.{name} is not supported (only its default), got {so[name]!r}")
    given = [k for k in STRUCTURED_OUTPUTS_KINDS if so.get(k) not in (None, False)]
    if len(given) != 1:
        raise ValueError(f"structured_outputs needs exactly one of {', '.join(STRUCTURED_OUTPUTS_KINDS)}, got "
                         f"{', '.join(given) or 'none'}")
    kind, v = given[0], so[given[0]]
    if kind == "json":
        return GrammarSpec.from_json_schema(v)
    if kind == "regex":
        if not isinstance(v, str):
            raise ValueError("structured_outputs.regex must be a string")
        return GrammarSpec.from_regex(v)
    if kind == "choice":
        return GrammarSpec.from_regex(choice_regex(v, "structured_outputs.choice"))
    if kind == "grammar":
        return GrammarSpec.from_ebnf(v)
    if kind == "json_object":
        if v is not True:
            raise ValueError("structured_outputs.json_object must be true")
        return GrammarSpec.json_object()
    return GrammarSpec.from_structural_tag(v)
