"""The grammar pre-check (constrained/automaton_size.py): regex bombs refused by its bounds, before outlines-core.

Hypothesis against references: the character DFA it builds accepts exactly what Python's `re.fullmatch`
accepts; its state cap refuses exactly the regexes whose DFA is over the cap; it never counts more states
than outlines-core's own index has for the same regex (so a refusal is never of a smaller automaton than
the one outlines-core would build). Named bombs are refused by a named bound; every legitimate grammar of
the tests and of benchmarks/bench_constrained.py is accepted, through the compile path itself.
"""

from __future__ import annotations

import importlib.util
import os
import re

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from radixlang_runtime.constrained.automaton_size import (MAX_POSITIONS, MAX_STATES, TooLarge, check_automaton_size,
                                                          determinize)
from radixlang_runtime.constrained.regex_dialect import Unanalysable, to_python_syntax
from radixlang_runtime.constrained.compile_index import grammar_regex
from radixlang_runtime.constrained.spec import DTYPE_REGEX, GrammarSpec

_ATOM = st.sampled_from(["a", "b", "c", "[ab]", "[bc]", "(a|b)", "(ab|c)", "(a|ab)", "(?:ba|b)"])
_QUANT = st.sampled_from(["", "", "*", "+", "?", "{2}", "{1,3}", "{0,2}", "{2,}", "{2}{2}", "*?"])


def _regexes(max_leaves: int) -> st.SearchStrategy[str]:
    """Small regexes over {a, b, c}: atoms, concatenation, alternation, every quantifier form."""
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        pairs = st.tuples(inner, inner)
        return st.one_of(pairs.map("".join), pairs.map(lambda t: f"({t[0]}|{t[1]})"),
                         st.tuples(inner, _QUANT).map(lambda t: f"(?:{t[0]}){t[1]}"))
    return st.recursive(st.tuples(_ATOM, _QUANT).map("".join), extend, max_leaves=max_leaves)


_WIDE_ATOM = st.sampled_from([".", "[^a]", r"\d", r"\W", "(?i:a)", "(?s:.)", r"[\sb]", r"\x{41}"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(regex=st.one_of(_regexes(6), st.tuples(_regexes(3), _WIDE_ATOM, _QUANT, _regexes(3)).map("".join)),
       texts=st.lists(st.text("abcA5 \n", max_size=7), min_size=1, max_size=20))
def test_the_dfa_accepts_what_python_re_fullmatch_accepts(regex, texts):
    try:
        dfa = determinize(regex)
    except TooLarge:  # nested counts can make a truly exponential DFA (`[ab]*a[ab]{16}`): the cap's case, below
        reject()
    python = re.compile(to_python_syntax(regex))
    for text in texts:
        assert dfa.matches(text) == (python.fullmatch(text) is not None), (regex, text)


@settings(max_examples=200, deadline=None)
@given(regex=_regexes(6), cap=st.integers(1, 40))
def test_the_state_cap_refuses_exactly_the_automata_over_it(regex, cap):
    try:
        full = determinize(regex).num_states
    except TooLarge:  # over the default cap, so over any smaller one
        full = MAX_STATES + 1
    if full > cap:
        with pytest.raises(TooLarge, match=f"more than {cap:,} automaton states"):
            determinize(regex, max_states=cap)
    else:
        assert determinize(regex, max_states=cap).num_states == full


@pytest.fixture(scope="module")
def tiny_vocab():
    from outlines_core import Vocabulary

    return Vocabulary(9, {b"a": [1], b"b": [2], b"c": [3], b"z": [4]})  # z: the end sentinel, as compile_index


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(regex=_regexes(4))
def test_never_more_states_than_outlines_core_builds(tiny_vocab, regex):
    """Over {a, b, c} every character is a token, so outlines-core's index has every state of its DFA."""
    from outlines_core import Index

    wrapped = f"(?:{regex})z"
    index = Index(wrapped, tiny_vocab)
    assert determinize(wrapped).num_states <= len(index.get_transitions()), regex


BOMBS = {
    ".*a.{20}": "automaton states",  # 2^21 subset states
    "(a|b)*a(a|b){20}": "automaton states",
    "(a*b*)*a(a|b){20}": "automaton states",  # nested quantifiers
    ".*a.{9}.*b.{9}": "automaton states",  # two windows: ~40,000 states
    "[0-9]{30000}": "automaton states",  # a state per copy: outlines-core took 26 s at 20,001 states
    "x[0-9]{10000}y[0-9]{10000}": "automaton states",  # the same, found by the subset construction
    "a{1000}{1000}": "character positions",
    "(a{300}){300}{300}": "character positions",
}


@pytest.mark.parametrize("regex,bound", BOMBS.items())
def test_bombs_are_refused_by_a_named_bound(regex, bound):
    with pytest.raises(ValueError, match=f"grammar too large: regex '{re.escape(regex)}' needs more than "
                                         f"[0-9,]+ {bound}.*\\(limit [0-9,]+\\)"):
        check_automaton_size(regex, f"regex {regex!r}")


def test_schema_bombs_are_refused_through_the_compile_path():
    from test_constrained_helpers import vocab

    from radixlang_runtime.constrained.grammar import compile_grammar

    states = f"more than {MAX_STATES:,} automaton states \\(limit {MAX_STATES:,}\\)"
    positions = f"more than {MAX_POSITIONS:,} character positions after expanding repetitions \\(limit "
    for schema, bound in [({"type": "string", "maxLength": 100000}, states),
                          ({"type": "string", "maxLength": 20000}, states),
                          ({"type": "array", "items": {"type": "string", "maxLength": 19000}}, positions)]:
        with pytest.raises(ValueError, match=f"grammar too large: json_schema needs {bound}"):
            compile_grammar(GrammarSpec.from_json_schema(schema), vocab())


def _bench_grammars() -> dict[str, GrammarSpec]:
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "bench_constrained.py")
    spec = importlib.util.spec_from_file_location("bench_constrained", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.GRAMMARS


def test_legitimate_grammars_are_accepted():
    from test_constrained_helpers import REGEXES, SCHEMAS

    specs = list(_bench_grammars().values()) + [GrammarSpec.from_json_schema(s) for s in SCHEMAS.values()]
    specs += [GrammarSpec.from_regex(r) for r in REGEXES]
    specs += [GrammarSpec.from_dtype(d) for d in DTYPE_REGEX]
    specs += [GrammarSpec.from_json_schema({"type": "string", "maxLength": 4000})]  # 4,003 states
    for spec in specs:
        dfa = check_automaton_size(grammar_regex(spec.kind, spec.compile_text), spec.describe())
        assert dfa is not None and dfa.num_states <= MAX_STATES, spec.describe()


def test_rust_only_syntax_is_translated_or_left_to_the_compile():
    assert to_python_syntax(r"\x{41}\u{e9}") == r"\U00000041\U000000E9"
    assert determinize(r"\p{L}+\d").num_states == 3  # \p{L} is one opaque symbol
    assert determinize("a{2}{3}").num_states == 7 and determinize("(?U)a+").num_states == 2
    assert check_automaton_size("[a-z&&[^x]]", "regex") is None  # class set operations: no verdict


def test_the_deadline_gives_no_verdict_rather_than_a_refusal():
    with pytest.raises(Unanalysable, match="deadline"):
        determinize(".*a.{20}", deadline_s=0.0)
