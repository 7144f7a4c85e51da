"""Shared pieces for the constrained-decoding tests (no tests here): the embedded SmolLM2 tokenizer
and its TokenVocab (built once per session), compiled grammars cached by spec, sample schemas and
regexes, and a hypothesis strategy for instances of the schema subset we support."""

from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import Any

from hypothesis import strategies as st

from radixlang_runtime.constrained.grammar import CompiledGrammar, compile_grammar
from radixlang_runtime.constrained.spec import GrammarSpec
from radixlang_runtime.constrained.vocab import TokenVocab, vocab_from_tokenizer

EOS = 2  # <|im_end|>


@lru_cache(maxsize=1)
def tokenizer():
    from tokenizers import Tokenizer

    from radixlang_runtime.model.loader.resolve import resolve_model_dir

    return Tokenizer.from_file(os.path.join(resolve_model_dir(None), "tokenizer.json"))


@lru_cache(maxsize=1)
def logits_width() -> int:
    from radixlang_runtime.model.loader.resolve import resolve_model_dir

    with open(os.path.join(resolve_model_dir(None), "config.json")) as f:
        return int(json.load(f)["vocab_size"])


@lru_cache(maxsize=1)
def vocab() -> TokenVocab:
    return vocab_from_tokenizer(tokenizer(), logits_width(), EOS)


def encode(text: str) -> list[int]:
    return tokenizer().encode(text, add_special_tokens=False).ids


@lru_cache(maxsize=64)
def _compiled(kind: str, source: str) -> CompiledGrammar:
    spec = GrammarSpec.from_regex(source) if kind == "regex" else GrammarSpec.from_json_schema(source)
    return compile_grammar(spec, vocab())


def grammar(spec: GrammarSpec) -> CompiledGrammar:
    return _compiled(spec.kind, spec.source)


def regex_grammar(pattern: str) -> CompiledGrammar:
    return _compiled("regex", pattern)


def schema_grammar(schema: dict) -> CompiledGrammar:
    return grammar(GrammarSpec.from_json_schema(schema))


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "email": {"type": "string", "format": "email"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                      "zip": {"type": "string", "pattern": "[0-9]{5}"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "address", "active"],
    "additionalProperties": False,
}
TOOL_CALL = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"},
                   "arguments": {"type": "object",
                                 "properties": {"location": {"type": "string", "maxLength": 20},
                                                "unit": {"enum": ["celsius", "fahrenheit"]}},
                                 "required": ["location", "unit"]}},
    "required": ["name", "arguments"],
}
REFS = {
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "number"}},
                        "required": ["x", "y"]}},
    "type": "object",
    "properties": {"points": {"type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 1, "maxItems": 3},
                   "label": {"anyOf": [{"type": "string", "maxLength": 6}, {"type": "null"}]}},
    "required": ["points", "label"],
}
SCHEMAS = {"person": PERSON, "tool_call": TOOL_CALL, "refs": REFS}

# Regexes valid in both Rust and Python syntax (hypothesis draws from Python's reading of them).
REGEXES = [
    r"[0-9]{3}-[0-9]{4}",
    r"(yes|no|maybe)",
    r"[a-z]{1,8}( [a-z]{1,8}){0,3}\.",
    r"[-+]?[0-9]+",
    r"[-+]?[0-9]*\.?[0-9]+",
    r"(True|False)",
    r"[a-z0-9._]{1,10}@[a-z]{1,8}\.(com|org|net)",
    r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
    r"The answer is (A|B|C|D)\.",
    r"[A-Z][a-z]{0,6}, [A-Z]{2} [0-9]{5}",
]


# --------------------------------------------------------------------------- schema instances
# the tokenizer has no byte 0xF1+
_STRING_CHARS = st.characters(max_codepoint=0x3FFFF, exclude_categories=("Cc", "Cs"), exclude_characters="\"\\\x7f")


def instances(schema: dict[str, Any], root: dict[str, Any] | None = None) -> st.SearchStrategy:
    """Values valid under `schema` (the subset SCHEMAS use), keys in schema order."""
    root = root or schema
    if "$ref" in schema:
        node: Any = root
        for part in schema["$ref"][2:].split("/"):
            node = node[part]
        return instances(node, root)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([instances(s, root) for s in schema["anyOf"]])
    t = schema.get("type")
    if t == "object":
        props = schema.get("properties", {})
        req = set(schema.get("required", []))

        @st.composite
        def obj(draw):
            out = {}
            for k, sub in props.items():
                if k in req or draw(st.booleans()):
                    out[k] = draw(instances(sub, root))
            return out

        return obj()
    if t == "array":
        return st.lists(instances(schema["items"], root), min_size=schema.get("minItems", 0),
                        max_size=schema.get("maxItems", 4))
    if t == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True, alphabet=st.characters(codec="ascii"))
        if schema.get("format") == "email":
            return st.from_regex(r"[a-z]{1,6}@[a-z]{1,6}\.com", fullmatch=True)
        return st.text(_STRING_CHARS, min_size=schema.get("minLength", 0), max_size=schema.get("maxLength", 12))
    if t == "integer":
        return st.integers(-10**6, 10**6)
    if t == "number":
        return st.one_of(st.integers(-1000, 1000), st.floats(-1e6, 1e6, allow_nan=False, width=32))
    if t == "boolean":
        return st.booleans()
    if t == "null":
        return st.none()
    raise AssertionError(f"no strategy for {schema}")


def dump(value: Any) -> str:
    """The layout schema grammars fix: {"k": v, "k2": [a, b]} (json.dumps' default separators)."""
    return json.dumps(value, ensure_ascii=False)
