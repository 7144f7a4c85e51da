"""Grammar specs: regex checks, JSON-schema checks (the unsupported named), fixed separators,
OpenAI / DSL entry points, compile errors. Compiles in this process (small grammars only)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from test_constrained_helpers import (PERSON, REFS, SCHEMAS, TOOL_CALL, dump, encode, instances, regex_grammar,
                                      schema_grammar, vocab)

from radixlang_runtime.constrained.compile_index import grammar_regex
from radixlang_runtime.constrained.grammar import compile_grammar
from radixlang_runtime.constrained.regex_check import MAX_EXPANSION, check_regex
from radixlang_runtime.constrained.schema import fixed_separators
from radixlang_runtime.constrained.spec import (DTYPE_REGEX, JSON_OBJECT_SCHEMA, GrammarSpec, spec_from_response_format,
                                                spec_from_sampling)


# --------------------------------------------------------------------------- regex checks
@pytest.mark.parametrize("pattern, words", [
    ("a(?=b)", "look-ahead"),
    ("a(?!b)", "negative look-ahead"),
    ("(?<=a)b", "look-behind"),
    (r"(a)\1", "backreference"),
    (r"(?P<x>a)(?P=x)", "backreference"),
    (r"\bword\b", "word boundary"),
    ("a^b", "anchor '^'"),
    ("a$b", "anchor '$'"),
    (r"\Aabc", "anchor"),
    ("(ab", "missing ')'"),
    ("ab)", "unbalanced ')'"),
    ("[abc", "unterminated character class"),
    ("abc\\", "trailing backslash"),
    ("a{1000}{1000}", "grammar too large"),
    ("((x{100}){100}){20}", "grammar too large"),
    ("(x{100}){100}" * 11, "grammar too large"),
])
def test_regex_problems_are_named(pattern, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        GrammarSpec.from_regex(pattern)


@pytest.mark.parametrize("pattern, cleaned", [
    ("^abc$", "abc"),
    (r"^a\$$", r"a\$"),
    (r"a\$", r"a\$"),
    (r"[\p{L}]+", r"[\p{L}]+"),
    (r"[]a]+[^]b]", r"[]a]+[^]b]"),
    (r"[a-z&&[^aeiou]]{2}", r"[a-z&&[^aeiou]]{2}"),
    (r"(?:ab|cd){3}\(\)", r"(?:ab|cd){3}\(\)"),
    ("a{3,}b{2,5}?", "a{3,}b{2,5}?"),
])
def test_valid_regexes_pass_with_outer_anchors_removed(pattern, cleaned):
    assert check_regex(pattern) == cleaned
    assert GrammarSpec.from_regex(pattern).key == GrammarSpec.from_regex(cleaned).key


def test_expansion_estimate_allows_realistic_counts():
    check_regex(r"[a-z]{1,64}@[a-z]{1,64}\.[a-z]{2,8}")
    check_regex("(" + "[0-9]{1,9}" * 100 + ")")
    with pytest.raises(ValueError):
        check_regex(f"a{{{MAX_EXPANSION + 1}}}")


def test_invalid_regex_from_the_compiler_names_the_problem():
    with pytest.raises(ValueError, match=r"invalid regex: min repeat greater than max repeat at position 2"):
        compile_grammar(GrammarSpec.from_regex("a{2,1}"), vocab())
    with pytest.raises(ValueError, match="invalid regex: bad character range z-a at position 1"):
        compile_grammar(GrammarSpec.from_regex("[z-a]"), vocab())
    with pytest.raises(ValueError, match="word boundary"):  # ASCII word boundaries are refused too
        compile_grammar(GrammarSpec.from_regex(r"x(?-u:\b)"), vocab())


# --------------------------------------------------------------------------- schema checks
@pytest.mark.parametrize("schema, words", [
    ({"type": "number", "minimum": 0}, "'minimum' is supported on {\"type\": \"integer\"} only at #"),
    ({"type": "integer", "minimum": 5, "exclusiveMaximum": 5}, "the integer range is empty (lowest 5 > highest 4)"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}},
     "unsupported keyword 'uniqueItems' at /properties/a"),
    ({"type": "object", "patternProperties": {"^x": {"type": "string"}}}, "unsupported keyword 'patternProperties'"),
    ({"not": {"type": "string"}}, "unsupported keyword 'not'"),
    ({"type": "strin"}, "unsupported type 'strin'"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "anyOf": [{"type": "object"}]},
     "'properties' together with 'anyOf'"),
    ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, "'allOf' with more than one schema"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
     "required property 'b' is not in 'properties'"),
    ({"type": "string", "pattern": "[a-z]+", "maxLength": 3}, "'pattern' together with 'maxLength'"),
    ({"type": "string", "pattern": "(?=x)"}, "look-ahead"),
    ({"type": "string", "format": "hostname"}, "string format 'hostname' is not supported"),
    ({"type": "array", "items": [{"type": "string"}]}, "'items' as a list is not supported"),
    ({"type": "array", "prefixItems": [{"type": "string"}], "maxItems": 2}, "'maxItems' together with 'prefixItems'"),
    ({"$ref": "http://example.com/s.json"}, "only local references"),
    ({"$ref": "#/$defs/missing"}, "does not resolve"),
    ({"enum": [{"a": 1}]}, "'enum' values must be"),
    ({"type": "object", "properties": {"a": True}}, "boolean schemas are not supported"),
    ({"description": "anything"}, "a schema needs 'type'"),
    ({"type": "string", "maxLength": -1}, "'maxLength' must be a non-negative integer"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
])
def test_schema_problems_are_named(schema, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        GrammarSpec.from_json_schema(schema)


def test_deep_nesting_is_refused_before_compiling():
    node: dict = {"type": "string"}
    for _ in range(40):
        node = {"type": "object", "properties": {"x": node}, "required": ["x"]}
    with pytest.raises(ValueError, match="nested deeper than 32"):
        GrammarSpec.from_json_schema(node)
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ValueError):
        GrammarSpec.from_json_schema(deep)


def test_schema_string_and_dict_give_one_key_and_annotations_are_ignored():
    a = GrammarSpec.from_json_schema(PERSON)
    b = GrammarSpec.from_json_schema(json.dumps(PERSON, indent=2))
    assert a == b and a.key == b.key
    c = GrammarSpec.from_json_schema({"title": "T", "description": "d", "x-extra": 1, **PERSON})
    assert c.key != a.key  # annotations are part of the text, but they compile


# --------------------------------------------------------------------------- fixed separators
def test_fixed_separator_rewrite_samples():
    m = "<WS>"
    assert fixed_separators(r'\{<WS>"a"<WS>:<WS>1<WS>,<WS>"b"<WS>:<WS>\[<WS>1(,<WS>2)<WS>\]<WS>\}', m) == \
        r'\{"a": 1, "b": \[1(, 2)\]\}'
    assert fixed_separators(r'\{<WS>\}', m) == r'\{\}'
    assert fixed_separators(r'("a"<WS>:<WS>1<WS>,)?<WS>"b"', m) == r'("a": 1, )?"b"'
    assert fixed_separators(r'((?:x)<WS>,<WS>"c")?', m) == r'((?:x), "c")?'
    assert fixed_separators(r'(?:<WS>x)', m) == r'(?:x)'
    assert fixed_separators(r'\[<WS>(1(,<WS>1){0,})?<WS>\]', m) == r'\[(1(, 1){0,})?\]'


def test_schema_regex_has_the_fixed_layout():
    r = grammar_regex("json_schema", GrammarSpec.from_json_schema(TOOL_CALL).compile_text)
    assert re.fullmatch(r, '{"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}')
    assert not re.fullmatch(r, '{"name":"get_weather","arguments":{"location":"Paris","unit":"celsius"}}')
    assert not re.fullmatch(r, '{ "name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"} }')
    assert "[ ]?" not in r


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(max_examples=25, deadline=None)
@given(data=__import__("hypothesis").strategies.data())
def test_schema_instances_match_regex_and_index(name, data):
    """json.dumps layout of any valid instance: matched by the regex (Python re) and by the index
    (walked token by token with the real tokenizer), and valid under jsonschema."""
    import jsonschema

    schema = SCHEMAS[name]
    value = data.draw(instances(schema))
    jsonschema.validate(value, schema)
    text = dump(value)
    spec = GrammarSpec.from_json_schema(schema)
    assert re.fullmatch(grammar_regex("json_schema", spec.compile_text), text), text
    g = schema_grammar(schema)
    end = g.accepts(encode(text))
    assert end is not None and g.is_final(end), text


def test_schema_outputs_validate_against_the_schema():
    """Walks of the index (random allowed tokens) that end in a final state parse as JSON valid
    under the schema: the grammar is no looser than the schema."""
    import random

    import jsonschema

    for name, schema in SCHEMAS.items():
        g = schema_grammar(schema)
        rng = random.Random(name)
        validated = 0
        for _ in range(10):
            s, out = g.initial_state, []
            for _ in range(400):
                a = g.allowed(s)
                if a.is_final and (len(a.ids) == 0 or rng.random() < 0.3):
                    break
                t = int(rng.choice(a.ids))
                out.append(t)
                s = g.next_state(s, t)
            if g.is_final(s):
                jsonschema.validate(json.loads(vocab().bytes_of(out).decode("utf-8")), schema)
                validated += 1
        assert validated >= 1, f"{name}: no walk of 400 tokens reached a final state"


# --------------------------------------------------------------------------- entry points
def test_sampling_and_openai_entry_points():
    assert spec_from_sampling(None, None) is None
    assert spec_from_sampling("[0-9]+", None) == GrammarSpec.from_regex("[0-9]+")
    assert spec_from_sampling(None, json.dumps(REFS)) == GrammarSpec.from_json_schema(REFS)
    with pytest.raises(ValueError, match="at most one"):
        spec_from_sampling("a", "{}")
    assert spec_from_response_format({"type": "text"}) is None
    assert spec_from_response_format({"type": "json_object"}).source == JSON_OBJECT_SCHEMA
    rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}
    assert spec_from_response_format(rf) == GrammarSpec.from_json_schema(PERSON)
    with pytest.raises(ValueError, match="unsupported response_format"):
        spec_from_response_format({"type": "grammar"})


def test_json_object_regex_accepts_objects_in_the_fixed_layout():
    r = grammar_regex("json_schema", JSON_OBJECT_SCHEMA)
    for v in [{}, {"a": 1}, {"a": "x", "b": [1, 2.5, None], "c": {"d": True}}, {"k": {"l": {"m": "deep"}}}]:
        assert re.fullmatch(r, dump(v)), v
    assert not re.fullmatch(r, "[1, 2]")
    assert not re.fullmatch(r, '{"a":1}')


@pytest.mark.parametrize("dtype, good, bad", [
    ("int", ["42", "-7", "+3 \n"], ["4.2", "x"]),
    ("float", ["3.14", "-0.5", ".5", "7"], ["1e5", "x"]),
    ("bool", ["True", "False"], ["true", "1"]),
    ("str", ['"hello world 42"', '""'], ['"a-b"', "hello"]),
])
def test_dsl_dtype_regexes(dtype, good, bad):
    spec = GrammarSpec.from_dtype(dtype)
    assert spec.source == DTYPE_REGEX[dtype]
    g = regex_grammar(spec.source)
    for text in good:
        end = g.accepts(encode(text))
        assert end is not None and g.is_final(end), text
    for text in bad:
        end = g.accepts(encode(text))
        assert end is None or not g.is_final(end), text
