"""The context-free backends' cost pre-check (constrained/grammar_cost.py): each hostile construct refused with
a message naming the construct and its limit; the grammars the other tests use pass; the refusal reaches the
caller of the backends' compile (xgrammar, llguidance) before the library runs."""

from __future__ import annotations

import json

import pytest
from grammars import ARITH_EBNF
from test_constrained_helpers import SCHEMAS

from radixlang_runtime.constrained.grammar_cost import (MAX_LITERAL_BYTES, MAX_REPEAT_PRODUCT, check_ebnf_cost,
                                                        check_regex_cost)
from radixlang_runtime.constrained.schema import schema_to_regex

NESTED_COUNTED = 'root ::= (("a"{0,50}){0,50}){0,50}'
AMBIGUOUS = 'root ::= s\ns ::= s s s | s s | [a-z] | ""'
LONG_LITERAL = 'root ::= "' + "ab" * 8000 + '"'
NESTED_STARS = r"(a*)*(a*)*(a*)*(a*)*"
HOSTILE_EBNF = {"nested_counted": (NESTED_COUNTED, "can match nothing"),
                "ambiguous": (AMBIGUOUS, "ambiguous recursion: rule s"),
                "long_literal": (LONG_LITERAL, f"string literal of 16,000 bytes in rule root "
                                               f"(limit {MAX_LITERAL_BYTES:,}")}


@pytest.mark.parametrize("name", sorted(HOSTILE_EBNF))
def test_hostile_ebnf_refused_by_construct(name):
    text, words = HOSTILE_EBNF[name]
    with pytest.raises(ValueError, match="grammar too expensive") as e:
        check_ebnf_cost(text, "ebnf")
    assert words in str(e.value)


@pytest.mark.parametrize("text,words", [
    ('root ::= x{0,200}\nx ::= "ab" [a-z]{0,100}', f"multiplying to 20,000 ({{0,200}} around a part of 100; "
                                                   f"limit {MAX_REPEAT_PRODUCT:,})"),
    ('root ::= e\ne ::= e "+" e | e "*" e | [0-9]', "in 2 alternatives"),
    ('root ::= ([a-z]+)*', "a repetition * of a repetition +"),
])
def test_more_constructs(text, words):
    with pytest.raises(ValueError) as e:
        check_ebnf_cost(text, "ebnf")
    assert words in str(e.value)


def test_regex_nested_stars_only_where_expensive():
    with pytest.raises(ValueError, match=r"repetition \* of a part that can match nothing"):
        check_regex_cost(NESTED_STARS, "regex", nested=True)
    check_regex_cost(NESTED_STARS, "regex", nested=False)  # llguidance's regex lexer is a DFA
    with pytest.raises(ValueError, match="string literal of 5,000 bytes"):
        check_regex_cost("x" * 5000, "regex", nested=False)  # > MAX_LITERAL_BYTES


@pytest.mark.parametrize("text", [
    ARITH_EBNF,
    'root ::= ws "x"\nws ::= ([ \\t\\n] ws)?',  # nullable, but one self reference behind a character
    'root ::= expr\nexpr ::= expr "+" term | term\nterm ::= [0-9]+',  # left recursion, one alternative
    'root ::= "[" (v ("," v)*)? "]"\nv ::= [0-9]{1,3} | root',
    'root ::= [a-z]{0,9000}',  # one counted repetition: linear
])
def test_ordinary_grammars_pass(text):
    check_ebnf_cost(text, "ebnf")


def test_schema_regexes_pass():
    for s in SCHEMAS.values():
        check_regex_cost(schema_to_regex(json.dumps(s)), "json_schema", nested=True)


def test_unreadable_text_is_left_to_the_backend():
    check_ebnf_cost('root ::= "unclosed', "ebnf")  # no verdict: the backend's parser names the error


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("text", [AMBIGUOUS, LONG_LITERAL], ids=["ambiguous", "long_literal"])
def test_backend_compile_refuses_before_the_library(backend, text):
    from radixlang_runtime.constrained.backends import compile_payload

    with pytest.raises(ValueError, match="grammar too expensive"):
        compile_payload(backend, "ebnf", text, None)  # no vocabulary needed: refused first


def test_regex_refused_on_xgrammar_only():
    from radixlang_runtime.constrained.backends import compile_payload

    with pytest.raises(ValueError, match="grammar too expensive: regex"):
        compile_payload("xgrammar", "regex", NESTED_STARS, None)
