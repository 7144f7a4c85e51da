"""Integer bounds in JSON schemas (minimum / maximum / exclusive*, pydantic's ge / le / gt / lt): the
digit-range regex matches exactly the integers in range, and schemas with bounds compile in every
backend to grammars that accept in-range values and refuse the rest; bounds elsewhere are named."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_constrained_helpers import EOS, encode, vocab

from radixlang_runtime.constrained.grammar import compile_grammar
from radixlang_runtime.constrained.int_range import int_range_regex
from radixlang_runtime.constrained.spec import GrammarSpec
from radixlang_runtime.constrained.state import GrammarState

BOUND = st.one_of(st.none(), st.integers(-3000, 3000), st.integers(-10**12, 10**12))


@settings(max_examples=300, deadline=None)
@given(lo=BOUND, hi=BOUND, probes=st.lists(st.integers(-10**13, 10**13) | st.integers(-3100, 3100), max_size=30))
def test_range_regex_matches_exactly_the_integers_in_range(lo, hi, probes):
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    r = re.compile(int_range_regex(lo, hi))
    for n in probes + [x + d for x in (lo, hi) if x is not None for d in (-1, 0, 1)] + [0, -1, 1]:
        assert bool(r.fullmatch(str(n))) == ((lo is None or n >= lo) and (hi is None or n <= hi)), (lo, hi, n)
    for bad in ("-0", "007", "+1", "1.0", ""):
        assert not r.fullmatch(bad)


def test_the_regex_grows_with_digits_not_with_the_range():
    assert len(int_range_regex(1, 10**15)) < 400


PERSON = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 18, "maximum": 130},
                                           "score": {"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 5},
                                           "count": {"type": "integer", "minimum": 0}},
          "required": ["age", "score", "count"], "additionalProperties": False}


def complete(g, text: str) -> bool:
    gs = GrammarState(g, [EOS])
    return all(gs.advance(t) for t in encode(text)) and gs.is_final


@pytest.mark.parametrize("backend", ["outlines", "xgrammar", "llguidance"])
def test_bounded_integers_compile_and_hold_in_every_backend(backend):
    g = compile_grammar(GrammarSpec.from_json_schema(PERSON), vocab(), backend)
    assert complete(g, '{"age": 18, "score": -4, "count": 0}')
    assert complete(g, '{"age": 130, "score": 4, "count": 123456789}')
    for bad in ('{"age": 17, "score": 0, "count": 0}', '{"age": 131, "score": 0, "count": 0}',
                '{"age": 20, "score": 5, "count": 0}', '{"age": 20, "score": -5, "count": 0}',
                '{"age": 20, "score": 0, "count": -1}', '{"age": 020, "score": 0, "count": 0}'):
        assert not complete(g, bad), bad


@pytest.mark.parametrize("schema, words", [
    ({"type": "number", "maximum": 1}, "'maximum' is supported on {\"type\": \"integer\"} only at #"),
    ({"type": ["integer", "null"], "minimum": 1}, "'minimum' is supported on"),
    ({"type": "integer", "minimum": 1.5}, "'minimum' must be an integer"),
    ({"type": "integer", "minimum": True}, "'minimum' must be an integer"),
    ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 3, "maximum": 2}}},
     "the integer range is empty (lowest 3 > highest 2) at /properties/a"),
])
def test_unsupported_bounds_are_named(schema, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        GrammarSpec.from_json_schema(schema)
