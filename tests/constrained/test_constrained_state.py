"""GrammarState and the index it walks: strings of a regex's language are accepted token by token
(real tokenizer), allowed tokens never lead outside the language, finish ids only at final states,
several final states, must_finish."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_constrained_helpers import EOS, REGEXES, SCHEMAS, encode, regex_grammar, schema_grammar, vocab

from radixlang_runtime.constrained.state import GrammarState

ASCII = st.characters(codec="ascii", exclude_categories=("Cc",))


@pytest.mark.parametrize("pattern", REGEXES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_language_strings_are_accepted_token_by_token(pattern, data):
    text = data.draw(st.from_regex(pattern, fullmatch=True, alphabet=ASCII))
    gs = GrammarState(regex_grammar(pattern), [EOS])
    for t in encode(text):
        assert gs.is_allowed(t), (text, t)
        assert gs.advance(t), (text, t)
    assert gs.is_final and gs.can_finish, text
    assert gs.advance(EOS) and gs.terminated and gs.must_finish


@pytest.mark.parametrize("pattern", REGEXES + [r"[0-9]+(\.[0-9]+)?", r"x|xy|xyz", r"3(xy)?"])
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_allowed_tokens_stay_inside_the_language(pattern, seed):
    """Random walks over allowed tokens: every allowed token has a live next state (allowed tokens or
    final), and a walk that stops in a final state spells a string of the language."""
    import re

    g = regex_grammar(pattern)
    rng = random.Random(seed)
    s, out = g.initial_state, []
    for _ in range(60):
        a = g.allowed(s)
        for t in rng.sample(list(a.ids), min(len(a.ids), 20)):
            nxt = g.next_state(s, int(t))
            assert nxt is not None
            b = g.allowed(nxt)
            assert len(b.ids) > 0 or b.is_final
        if len(a.ids) == 0 or (a.is_final and rng.random() < 0.25):
            break
        t = int(rng.choice(a.ids))
        out.append(t)
        s = g.next_state(s, t)
    if g.is_final(s):
        assert re.fullmatch(pattern, vocab().bytes_of(out).decode("utf-8"))


@pytest.mark.parametrize("pattern, text", [
    (r"[0-9]+(\.[0-9]+)?", "3.5"),  # the end sentinel: outlines-core alone drops "." after "3"
    (r"[-+]?[0-9]*\.?[0-9]+[ \n]*", "3.14"),
    (r"x|xy", "xy"),
    (r"3(xy)?", "3xy"),
    (r"(ab)?a", "aba"),
    (r"\d{2}", "٣٤"),  # Rust's \d is Unicode (Arabic-Indic digits), as CONSTRAINED.md notes
])
def test_continuing_past_a_final_state_with_single_byte_tokens(pattern, text):
    g = regex_grammar(pattern)
    ids = [int(vocab().single_byte_ids[b]) for b in text.encode()]
    gs = GrammarState(g, [EOS])
    for k, t in enumerate(ids):
        assert gs.advance(t), (pattern, text[:k + 1])
    assert gs.is_final


def test_finish_ids_only_in_final_states():
    g = regex_grammar(r"[0-9]{2}( [0-9]{2})?")
    newline = encode("\n")[0]
    gs = GrammarState(g, [EOS, newline, 10**9])
    assert gs.finish_ids == tuple(sorted((EOS, newline)))  # ids outside the logits are dropped
    assert not gs.can_finish and not gs.is_allowed(EOS) and not gs.advance(EOS)
    assert gs.advance_all(encode("12"))
    assert gs.is_final and gs.can_finish and not gs.must_finish  # " 34" may still follow
    c = gs.copy()
    assert gs.advance_all(encode(" 34")) and gs.must_finish and gs.is_final
    assert c.advance(newline) and c.terminated and c.must_finish
    assert not c.advance(encode("1")[0])  # nothing after a finish id
    assert not gs.advance(encode("5")[0])  # illegal: state unchanged
    assert gs.is_final and gs.advance(EOS) and gs.terminated


def test_must_finish_when_nothing_can_follow():
    gs = GrammarState(schema_grammar(SCHEMAS["tool_call"]), [EOS])
    text = '{"name": "get_weather", "arguments": {"location": "Oslo", "unit": "celsius"}}'
    assert gs.advance_all(encode(text))
    assert gs.is_final and gs.must_finish and len(gs.allowed().ids) == 0
    gs2 = GrammarState(regex_grammar(r"(yes|no|maybe)"), [])
    assert gs2.advance_all(encode("maybe")) and gs2.must_finish


def test_stop_token_that_is_text_is_not_taken_as_text_mid_grammar():
    """A request stop id that the grammar also allows as text must not end a match early."""
    comma = encode(",")[0]
    g = regex_grammar(r"[a-z]+,[a-z]+")
    gs = GrammarState(g, [EOS, comma])
    assert gs.advance_all(encode("ab"))
    assert not gs.is_allowed(comma) and not gs.advance(comma)
    gs_plain = GrammarState(g, [EOS])
    assert gs_plain.advance_all(encode("ab")) and gs_plain.advance(comma)
