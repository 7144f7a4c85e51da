"""Jump-forward: forced bytes from the index, forced tokens = the tokenizer's tokens of those bytes
(with hold-back), and decoding with jump-forward on gives the same tokens as with it off.

The "model" in the on/off comparison is a deterministic function of the prefix: it emits the
canonical tokens (tokenizer.encode) of a target text W while the prefix is a prefix of them, then EOS;
on any other prefix it picks the allowed token with the smallest hash of (prefix, token). A forced
token that differs from what the model would have sampled sends it down the hash branch, and the
outputs differ. (A pure hash scorer cannot be the reference: it picks non-canonical tokenizations
that no tokenizer-trained model, and no jump-forward, would produce.)"""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_constrained_helpers import (EOS, PERSON, REGEXES, SCHEMAS, TOOL_CALL, dump, encode, instances,
                                      regex_grammar, schema_grammar, vocab)

from radixlang_runtime.constrained.grammar import CompiledGrammar
from radixlang_runtime.constrained.jump_forward import (draft_tokens, forced_bytes, forced_run, forced_tokens,
                                                       learn_rejection)
from radixlang_runtime.constrained.state import GrammarState

ASCII = st.characters(codec="ascii", exclude_categories=("Cc",))


def _hash_pick(prefix: list[int], ids) -> int:
    """The allowed id with the smallest hash of (prefix, id), vectorised (string states allow ~49k ids)."""
    seed = int.from_bytes(hashlib.blake2b(",".join(map(str, prefix)).encode(), digest_size=8).digest(), "little")
    x = np.asarray(ids, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(seed)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(29)
    return int(np.asarray(ids)[int(np.argmin(x))])


def decode(g: CompiledGrammar, target: list[int], jump: bool, max_steps: int = 400) -> tuple[list[int], int]:
    """-> (output tokens, forward passes). Stops at EOS or when the grammar must finish."""
    gs = GrammarState(g, [EOS])
    out: list[int] = forced_tokens(gs) if jump else []
    passes = 0
    while not gs.must_finish and passes < max_steps:
        passes += 1
        n = len(out)
        if out == target[:n] and n < len(target):
            t = target[n]
        elif out == target and gs.can_finish:
            t = EOS
        else:
            allowed = list(gs.allowed().ids) + ([EOS] if gs.can_finish else [])
            t = _hash_pick(out, allowed)
        assert gs.advance(t), (out, t)
        out.append(t)
        if gs.terminated:
            break
        if jump:
            out += forced_tokens(gs)
    return out, passes


def _check_on_equals_off(g: CompiledGrammar, text: str) -> tuple[int, int]:
    target = encode(text)
    end = g.accepts(target)
    assert end is not None and g.is_final(end), text
    off, passes_off = decode(g, target, jump=False)
    on, passes_on = decode(g, target, jump=True)
    assert on == off, (text, [vocab().token_bytes[t] for t in on], [vocab().token_bytes[t] for t in off])
    assert off[: len(target)] == target
    assert passes_on <= passes_off
    return passes_on, passes_off


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_jump_forward_on_equals_off_for_schemas(name, data):
    value = data.draw(instances(SCHEMAS[name]))
    _check_on_equals_off(schema_grammar(SCHEMAS[name]), dump(value))


@pytest.mark.parametrize("pattern", REGEXES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_jump_forward_on_equals_off_for_regexes(pattern, data):
    text = data.draw(st.from_regex(pattern, fullmatch=True, alphabet=ASCII))
    _check_on_equals_off(regex_grammar(pattern), text)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_hash_model_outputs_stay_valid_with_jump_forward(name):
    """With the pure hash scorer (no target) jump-forward still yields outputs of the language."""
    import jsonschema

    g = schema_grammar(SCHEMAS[name])
    out, _ = decode(g, [], jump=True, max_steps=300)  # the hash scorer is deterministic: one decode
    if out and out[-1] == EOS:
        out = out[:-1]
    gs = GrammarState(g, [EOS])
    assert gs.advance_all(out)  # whatever the length, the output is a prefix of the language
    if gs.is_final:  # a finished output is a valid instance as well
        jsonschema.validate(json.loads(vocab().bytes_of(out).decode("utf-8")), SCHEMAS[name])


def test_forced_tokens_are_the_tokenizers_tokens_of_the_forced_bytes():
    """At states along random walks: forced tokens spell a prefix of the forced bytes; with nothing held
    back they are exactly tokenizer.encode(forced bytes)."""
    v = vocab()
    checked_full = 0
    for g in [schema_grammar(s) for s in SCHEMAS.values()] + [regex_grammar(p) for p in REGEXES]:
        rng = random.Random(g.spec.key)
        for _ in range(6):
            s = g.initial_state
            for _ in range(40):
                fb = forced_bytes(g, s)
                run = forced_run(g, s)
                spelled = v.bytes_of(list(run.token_ids))
                assert fb.data.startswith(spelled)
                assert len(fb.data) - len(spelled) == run.held_back
                if run.token_ids and run.held_back == 0:
                    assert list(run.token_ids) == encode(fb.data.decode("utf-8"))
                    checked_full += 1
                elif run.token_ids:
                    assert list(run.token_ids) == encode(spelled.decode("utf-8"))
                a = g.allowed(s)
                if len(a.ids) == 0:
                    break
                s = g.next_state(s, int(rng.choice(a.ids)))
    assert checked_full > 0


def test_hold_back_leaves_the_separator_to_the_model():
    g = schema_grammar(PERSON)
    fb = forced_bytes(g, g.initial_state)
    assert fb.data == b'{"name": "'
    run = forced_run(g, g.initial_state)
    assert [vocab().token_bytes[t] for t in run.token_ids] == [b'{"', b"name", b'":']
    assert run.held_back == 2  # ' "' : the model may write ' "' or a merge such as ' ""'


def test_tool_call_needs_far_fewer_forward_passes():
    g = schema_grammar(TOOL_CALL)
    text = '{"name": "get_weather", "arguments": {"location": "San Francisco", "unit": "celsius"}}'
    on, off = _check_on_equals_off(g, text)
    print(f"\n[jump-forward] tool call: {off} forward passes without, {on} with")
    assert on * 2 < off


def test_max_tokens_and_counts():
    g = schema_grammar(TOOL_CALL)
    gs = GrammarState(g, [EOS])
    first = forced_tokens(gs, max_tokens=2)
    assert len(first) == 2 and gs.num_forced == 2
    rest = forced_tokens(gs)
    full = forced_tokens(GrammarState(g, [EOS]))
    assert first + rest == full and gs.num_forced == len(full)
    assert forced_tokens(gs) == []  # held back: the model chooses next


def test_no_forcing_at_final_states_or_through_stop_ids():
    g = regex_grammar(r"ab(cdef)?")
    gs = GrammarState(g, [EOS])
    assert gs.advance_all(encode("ab")) and gs.is_final
    assert forced_tokens(gs) == []  # final: the model may stop here
    comma = encode(",")[0]
    g2 = regex_grammar(r"x, y")
    gs2 = GrammarState(g2, [EOS, comma])
    assert gs2.advance_all(encode("x"))
    assert forced_tokens(gs2) == []  # ", y" is forced, but "," is a stop id of this request
    gs3 = GrammarState(g2, [EOS])
    assert gs3.advance_all(encode("x")) and vocab().bytes_of(forced_tokens(gs3)) == b", y"
    assert gs3.must_finish


def test_draft_tokens_follow_the_models_rejections():
    g = schema_grammar(TOOL_CALL)
    g.draft_prefs.clear()  # grammars are shared between tests
    try:
        canonical = forced_tokens(GrammarState(g, [EOS]))
        assert draft_tokens(GrammarState(g, [EOS])) == canonical  # nothing learned: the tokenizer's split
        first = vocab().bytes_of(canonical[:1])
        assert len(first) > 1, first  # e.g. '{"': the model may spell it '{' then '"'
        shorter = encode(first[:1].decode())
        assert len(shorter) == 1
        learn_rejection(GrammarState(g, [EOS]), EOS)  # a finish id is never learned
        learn_rejection(GrammarState(g, [EOS]), encode("z")[0])  # nor a token the grammar refuses here
        assert len(g.draft_prefs) == 0
        learn_rejection(GrammarState(g, [EOS]), shorter[0])
        gs_draft, gs_canon = GrammarState(g, [EOS]), GrammarState(g, [EOS])
        draft = draft_tokens(gs_draft)
        canon = forced_tokens(gs_canon)
        assert canon == canonical  # forced_tokens itself never changes
        assert draft[0] == shorter[0] and draft != canonical
        assert vocab().bytes_of(draft) == vocab().bytes_of(canonical)  # the same forced text, split the model's way
        assert gs_draft.state == gs_canon.state and gs_draft.num_forced == len(draft)
        capped = draft_tokens(GrammarState(g, [EOS]), max_tokens=1)
        assert capped == draft[:1]
    finally:
        g.draft_prefs.clear()
