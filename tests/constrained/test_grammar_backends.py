"""Grammar backends (--grammar-backend outlines | xgrammar | llguidance): the same language for regex and
json_schema in every backend, EBNF and structural tags through the context-free backends (outlines
refuses them by name), bad EBNF named, and on the real model (Engine, fp32, greedy): EBNF outputs parse
with a reference parser (lark), jump-forward on and off give identical text with xgrammar too."""

from __future__ import annotations

from conftest import running_engine

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lark import Lark
from grammars import ARITH_EBNF, ARITH_LARK
from test_constrained_helpers import EOS, SCHEMAS, dump, encode, instances, vocab

from radixlang_runtime.constrained.grammar import compile_grammar
from radixlang_runtime.constrained.jump_forward import forced_tokens
from radixlang_runtime.constrained.spec import GrammarSpec
from radixlang_runtime.constrained.state import GrammarState

BACKENDS = ("outlines", "xgrammar", "llguidance")
CF_BACKENDS = ("xgrammar", "llguidance")

SQL_EBNF = r'''root ::= "SELECT " cols " FROM " table where ";"
cols ::= "*" | col | col ", " col
col ::= "id" | "name" | "age" | "total"
table ::= "users" | "orders"
where ::= "" | " WHERE " col " = " num
num ::= [0-9] | [1-9] [0-9]
'''
SQL_LARK = r'''start: "SELECT " cols " FROM " TABLE where ";"
cols: "*" | COL | COL ", " COL
COL: "id" | "name" | "age" | "total"
TABLE: "users" | "orders"
where: | " WHERE " COL " = " NUM
NUM: /[1-9]?[0-9]/
'''
TAG = {"structures": [{"begin": "<function=get_weather>", "end": "</function>",
                       "schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                                  "required": ["city"], "additionalProperties": False}}],
       "triggers": ["<function="]}
# Bounded schemas for the on/off comparison (an unbounded integer lets a greedy small model loop on digits).
JF_SCHEMAS = {
    "flat": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                              "age": {"type": "integer", "maxDigits": 3}},
             "required": ["name", "age"], "additionalProperties": False},
    "enum": {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]},
                                              "confidence": {"enum": ["low", "medium", "high"]}},
             "required": ["sentiment", "confidence"], "additionalProperties": False},
    "tool_call": {"type": "object", "properties": {"name": {"enum": ["get_weather", "search_web"]},
                                                   "arguments": {"type": "object", "properties": {
                                                       "query": {"type": "string", "maxLength": 24}},
                                                       "required": ["query"], "additionalProperties": False}},
                  "required": ["name", "arguments"], "additionalProperties": False},
}
PARITY_REGEXES = [r"[0-9]{3}-[0-9]{4}", r"(yes|no|maybe)", r"[a-z]{1,8}( [a-z]{1,8}){0,3}\."]

_GRAMMARS: dict = {}


def grammar(spec: GrammarSpec, backend: str):
    key = (spec.key, backend)
    if key not in _GRAMMARS:
        _GRAMMARS[key] = compile_grammar(spec, vocab(), backend)
    return _GRAMMARS[key]


def walk(g, text: str) -> GrammarState:
    gs = GrammarState(g, [EOS])
    for t in encode(text):
        assert gs.advance(t), (g, text, t)
    return gs


# ---------------------------------------------------------------- same language in every backend
@pytest.mark.parametrize("name", ["person", "tool_call"])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_schema_instances_are_accepted_and_complete_in_every_backend(name, data):
    value = data.draw(instances(SCHEMAS[name]))
    spec = GrammarSpec.from_json_schema(SCHEMAS[name])
    for backend in BACKENDS:
        gs = walk(grammar(spec, backend), dump(value))
        assert gs.is_final, backend


@pytest.mark.parametrize("pattern", PARITY_REGEXES)
def test_regex_masks_agree_with_outlines_along_a_match(pattern):
    """xgrammar's mask equals outlines' at every prefix of a match (llguidance narrows forced stretches
    to the tokenizer's split, so for it: the outlines-allowed set contains its set)."""
    text = {"[0-9]{3}-[0-9]{4}": "555-1234", "(yes|no|maybe)": "maybe"}.get(pattern, "ab cd.")
    spec = GrammarSpec.from_regex(pattern)
    states = {b: GrammarState(grammar(spec, b), [EOS]) for b in BACKENDS}
    for t in encode(text) + [None]:
        ref = set(states["outlines"].allowed().ids.tolist())
        assert set(states["xgrammar"].allowed().ids.tolist()) == ref
        assert set(states["llguidance"].allowed().ids.tolist()) <= ref
        assert len({s.is_final for s in states.values()}) == 1
        if t is not None:
            assert all(s.advance(t) for s in states.values())
    assert states["outlines"].is_final


# ---------------------------------------------------------------- EBNF and structural tags (no model)
@pytest.mark.parametrize("backend", CF_BACKENDS)
def test_ebnf_accepts_its_language_only(backend):
    g = grammar(GrammarSpec.from_ebnf(ARITH_EBNF), backend)
    assert walk(g, "(3 + 4) * 12").is_final
    gs = walk(g, "(3 + 4")
    assert not gs.is_final and gs.grammar.accepts(encode("(3 + 4"), None) is not None
    assert g.accepts(encode("3 ++ 4")) is None
    assert g.accepts(encode("0")) is None


@pytest.mark.parametrize("backend", CF_BACKENDS)
def test_bad_ebnf_is_named(backend):
    with pytest.raises(ValueError, match=r"ebnf: .*expr"):
        compile_grammar(GrammarSpec.from_ebnf("root ::= expr"), vocab(), backend)


def test_outlines_refuses_ebnf_and_structural_tag_by_name():
    for spec in (GrammarSpec.from_ebnf(ARITH_EBNF), GrammarSpec.from_structural_tag(TAG)):
        with pytest.raises(ValueError, match=f"{spec.kind} grammars need --grammar-backend xgrammar or llguidance"):
            compile_grammar(spec, vocab(), "outlines")


@pytest.mark.parametrize("bad,match", [
    ({"structures": [], "triggers": ["<f"]}, "structures"),
    ({"structures": [{"begin": "<g>", "schema": {}, "end": ""}], "triggers": ["<f"]}, "starts with no trigger"),
    ({"structures": [{"begin": "<f>", "schema": {"type": "number", "minimum": 1}, "end": ""}], "triggers": ["<f"]},
     "minimum"),
    ({"structures": [{"begin": "<f>", "end": ""}], "triggers": ["<f"]}, "exactly begin, schema, end"),
])
def test_structural_tag_shape_errors_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        GrammarSpec.from_structural_tag(bad)


@pytest.mark.parametrize("backend", CF_BACKENDS)
def test_structural_tag_free_text_then_a_valid_structure(backend):
    g = grammar(GrammarSpec.from_structural_tag(TAG), backend)
    assert walk(g, "Let me check.").is_final  # free text may end anywhere
    gs = walk(g, 'ok <function=get_weather>{"city": "Rome"}</function>')
    assert gs.is_final
    assert g.accepts(encode('ok <function=get_weather>{"town": "Rome"}')) is None
    assert g.accepts(encode("ok <function=other>")) is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_jump_forward_forces_the_schema_wrapper(backend):
    g = grammar(GrammarSpec.from_json_schema(SCHEMAS["person"]), backend)
    gs = GrammarState(g, [EOS])
    forced = forced_tokens(gs)
    assert vocab().bytes_of(forced) == b'{"name":'  # `": ` held back: the model may merge it with the value


def test_check_request_refuses_ebnf_on_outlines_by_name():
    from radixlang_runtime.protocol.limits import RuntimeLimits, check_request
    from radixlang_runtime.protocol.sampling_params import SamplingParams

    sp = SamplingParams.from_dict({"ebnf": ARITH_EBNF, "max_new_tokens": 4})
    check_request([1, 2], sp, RuntimeLimits(2048, 49152, 8192, grammar_backend="xgrammar"))
    with pytest.raises(ValueError, match="ebnf grammars need --grammar-backend xgrammar or llguidance"):
        check_request([1, 2], sp, RuntimeLimits(2048, 49152, 8192, grammar_backend="outlines"))
    with pytest.raises(ValueError, match="at most one of"):
        SamplingParams.from_dict({"ebnf": ARITH_EBNF, "regex": "a"})


def test_auto_backend_routes_each_kind_to_a_backend_that_compiles_it():
    """--grammar-backend auto (the default): check_request takes every kind; the KindRoutedCompiler sends regex /
    json_schema to outlines and ebnf / structural_tag to xgrammar, starting a backend's compiler on first use."""
    from radixlang_runtime.constrained.auto_compiler import KindRoutedCompiler
    from radixlang_runtime.constrained.backends import backend_for
    from radixlang_runtime.constrained.cache import GrammarCacheConfig, GrammarCompiler
    from radixlang_runtime.protocol.limits import RuntimeLimits, check_request
    from radixlang_runtime.protocol.sampling_params import SamplingParams
    from radixlang_runtime.server_args import ServerArgs

    assert ServerArgs().grammar_backend == "auto"
    check_request([1, 2], SamplingParams.from_dict({"ebnf": ARITH_EBNF, "max_new_tokens": 4}),
                  RuntimeLimits(2048, 49152, 8192, grammar_backend="auto"))
    assert [backend_for("auto", k) for k in ("regex", "json_schema", "ebnf", "structural_tag")] == \
        ["outlines", "outlines", "xgrammar", "xgrammar"]
    assert backend_for("llguidance", "regex") == "llguidance"  # a pin is kept
    routed = KindRoutedCompiler(lambda b: GrammarCompiler(vocab(), GrammarCacheConfig(num_workers=1, backend=b)))
    try:
        routed.start()
        assert list(routed.compilers) == ["outlines"]
        handles = [routed.submit(GrammarSpec.from_regex("[0-9]+")), routed.submit(GrammarSpec.from_ebnf(ARITH_EBNF))]
        assert [h.wait(60) for h in handles] == ["ready", "ready"], [h.error for h in handles]
        assert sorted(routed.compilers) == ["outlines", "xgrammar"]
        assert routed.stats["compiled"] + routed.stats["from_disk"] == 2 and routed.num_pending == 0
        assert routed.get(GrammarSpec.from_ebnf(ARITH_EBNF)) is handles[1].grammar
    finally:
        routed.close()


# ---------------------------------------------------------------- the real model (xgrammar backend)
def chat(q: str) -> str:
    return f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def xg_engine():
    yield from running_engine(dtype="float32", max_total_tokens=4096, grammar_backend="xgrammar")


def set_jump_forward(engine, on: bool) -> None:
    engine._loop.call(lambda s: setattr(s.grammar, "jump_forward", on))


@pytest.mark.parametrize("ebnf,reference,question", [
    (ARITH_EBNF, ARITH_LARK, "Write an arithmetic expression that equals 12."),
    (SQL_EBNF, SQL_LARK, "Write a SQL query that lists the names of users aged 30."),
])
def test_ebnf_outputs_parse_with_a_reference_parser(xg_engine, ebnf, reference, question):
    out = xg_engine.generate(chat(question), {"temperature": 0, "max_new_tokens": 48, "ebnf": ebnf})
    assert out["meta_info"]["finish_reason"]["type"] == "stop", out
    Lark(reference, parser="earley").parse(out["text"])  # raises on text outside the language


def test_bad_ebnf_through_the_engine_names_the_rule(xg_engine):
    with pytest.raises(ValueError, match='Rule "nothing" is not defined'):
        xg_engine.generate("x", {"max_new_tokens": 4, "ebnf": "root ::= nothing"})


def test_jump_forward_on_off_identical_in_float32_with_xgrammar(xg_engine):
    """The README's promise: in float32 (and the deterministic mode) jump-forward changes no text."""
    names = sorted(JF_SCHEMAS)
    prompts = [chat(f"Ann Lee, 34, wants the weather in Rome. Reply with a JSON object ({n}).") for n in names]
    sps = [{"temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(JF_SCHEMAS[n])} for n in names]
    try:
        on = xg_engine.generate(prompts, sps)
        set_jump_forward(xg_engine, False)
        off = xg_engine.generate(prompts, sps)
    finally:
        set_jump_forward(xg_engine, True)
    for n, a, b in zip(names, on, off):
        assert a["output_ids"] == b["output_ids"], n
        assert a["meta_info"]["forced_tokens"] > 0 and b["meta_info"]["forced_tokens"] == 0
        jsonschema.validate(json.loads(a["text"]), JF_SCHEMAS[n])


# ---------------------------------------------------------------- the compile sandbox, every backend
@pytest.mark.parametrize("backend", CF_BACKENDS)
def test_compile_child_compiles_refuses_bombs_and_names_bad_ebnf(backend):
    from radixlang_runtime.constrained.cache import GrammarCacheConfig, GrammarCompiler

    compiler = GrammarCompiler(vocab(), GrammarCacheConfig(num_workers=1, timeout_s=60, backend=backend))
    try:
        good = compiler.submit(GrammarSpec.from_ebnf(SQL_EBNF))
        bomb = compiler.submit(GrammarSpec.from_regex(".*a.{20}"))
        bad = compiler.submit(GrammarSpec.from_ebnf("root ::= col\ncol ::= [a-z"))
        assert good.wait(120) == "ready", good.error
        assert walk(good.grammar, "SELECT name FROM users WHERE age = 30;").is_final
        assert bomb.wait(120) == "error" and "grammar too large" in bomb.error
        assert bad.wait(120) == "error" and bad.error.startswith("ebnf: ")
    finally:
        compiler.close()


def test_openai_response_format_structural_tag_maps_to_the_sampling_field():
    from radixlang_runtime.server.openai_records import sampling_fields

    sp, _ = sampling_fields({"response_format": dict(TAG, type="structural_tag")})
    assert json.loads(sp["structural_tag"]) == json.loads(GrammarSpec.from_structural_tag(TAG).source)
    assert json.loads(sp["structural_tag"])["triggers"] == ["<function="]


def test_structural_tag_through_the_engine(xg_engine):
    """Free text, and wherever the trigger appears a complete structure follows (checked by parsing)."""
    prompt = chat("Call get_weather for Rome using <function=get_weather>{...}</function>.")
    out = xg_engine.generate(prompt, {"temperature": 0, "max_new_tokens": 48,
                                      "structural_tag": json.dumps(TAG)})
    g = grammar(GrammarSpec.from_structural_tag(TAG), "xgrammar")
    ids = out["output_ids"][:-1] if out["output_ids"][-1:] == [EOS] else out["output_ids"]
    assert g.accepts(ids) is not None  # every token the engine produced is in the grammar's language
    for part in out["text"].split("<function=get_weather>")[1:]:
        body = part.split("</function>")[0]
        jsonschema.validate(json.loads(body), TAG["structures"][0]["schema"])


@pytest.mark.parametrize("backend", ["outlines", "xgrammar"])
def test_guess_is_the_held_back_tail_split_by_the_tokenizer(backend):
    from radixlang_runtime.constrained.jump_forward import forced_bytes, guess_tokens

    g = grammar(GrammarSpec.from_json_schema(SCHEMAS["person"]), backend)
    gs = GrammarState(g, [EOS])
    forced = forced_tokens(gs)
    held = forced_bytes(g, gs.state).data
    guess = guess_tokens(gs)
    assert held == b' "' and guess == encode(' "')  # before the name's text: forced bytes the model may merge
    assert vocab().bytes_of(forced + guess) == b'{"name": "'
    assert guess_tokens(gs) == []  # inside the string nothing is forced, so nothing is guessed
    assert guess_tokens(GrammarState(g, [EOS]), max_tokens=0) == []


@pytest.mark.parametrize("backend", ["outlines", "xgrammar"])
def test_a_learned_draft_reaches_other_outputs_before_the_same_forced_text(backend):
    """The model spelled ` "age"` as ` ` + `"` after one name: a draft after another name follows it too.
    outlines: both outputs stand in one automaton state; xgrammar's states are token paths, so what it learns
    is keyed by the forced text there (jump_forward.pref_key), else no other output would ever use it."""
    from radixlang_runtime.constrained.jump_forward import draft_tokens, learn_rejection

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    g = compile_grammar(GrammarSpec.from_json_schema(schema), vocab(), backend)  # fresh: nothing learned yet

    def after(name: str) -> GrammarState:
        gs = GrammarState(g, [EOS])
        assert gs.advance_all(encode(json.dumps({"name": name})[:-1] + ","))
        return gs

    canonical = forced_tokens(after("Ann"))
    assert vocab().bytes_of(canonical) == b' "age":' and canonical[0] == encode(' "')[0]
    assert draft_tokens(after("Bob")) == canonical  # nothing learned: the tokenizer's split
    learn_rejection(after("Ann"), encode(" ")[0])
    spelled = draft_tokens(after("Bob"))
    assert spelled[0] == encode(" ")[0] and vocab().bytes_of(spelled) == vocab().bytes_of(canonical)
