"""The one intake (generate_input.py): n fan-out, rid rules and per-prompt extras (cache_salt, return_hidden_states)
in one place, the same for the native body, the Engine's arguments and the OpenAI routes; the scheduler's message
carries the validated parameters and the ready grammar spec, decoded trusted on arrival (no from_dict, no spec
built again). No model, no torch."""

from __future__ import annotations

import pytest

from radixlang_runtime.protocol import messages as m
from radixlang_runtime.protocol.bootstrap_peers import Bootstrap
from radixlang_runtime.protocol.generate_input import (GenerateRequest, fan_out, openai_requests, parse_bootstrap,
                                              parse_generate_body, parse_generate_input)
from radixlang_runtime.protocol.limits import MAX_BATCH, RuntimeLimits
from radixlang_runtime.protocol.results import LogprobRequest
from radixlang_runtime.protocol.sampling_params import SamplingParams

LIMITS = RuntimeLimits(context_len=256, vocab_size=100, num_slots=4096)


def encode(text: str) -> list[int]:
    return [ord(c) % 100 for c in text]


def body(**kw) -> tuple[list[GenerateRequest], bool]:
    return parse_generate_body(kw, encode, LIMITS, encode)


def test_native_rids_follow_one_rule():
    reqs, as_list = body(text=["ab", "cd"], rid=["x", "y"], sampling_params={"n": 2, "max_new_tokens": 3})
    assert as_list and [r.rid for r in reqs] == ["x-0", "x-1", "y-0", "y-1"]
    assert [r.index for r in reqs] == [0, 1, 2, 3]
    one, as_list = body(text="ab", rid="solo")
    assert not as_list and [r.rid for r in one] == ["solo"]
    fresh, _ = body(text=["ab", "cd"])  # missing rids: assigned here, distinct
    assert len({r.rid for r in fresh}) == 2 and all(len(r.rid) == 32 for r in fresh)


def test_duplicate_rids_are_refused_on_every_entrance():
    with pytest.raises(ValueError, match="duplicate rid") as e:
        body(text=["a", "b"], rid=["same", "same"])
    assert e.value.param == "rid"
    with pytest.raises(ValueError, match="duplicate rid"):  # the Engine's arguments take the same path
        parse_generate_input(["a", "b"], None, None, ["z", "z"], False, None, None, None, encode, LIMITS)
    with pytest.raises(ValueError, match="duplicate rid"):  # "x" with n=2 gives x-0, which collides
        body(text=["a", "b"], rid=["x", "x-0"], sampling_params=[{"n": 2}, {}])


def test_openai_choices_share_the_rules():
    def lp(i: int, ids: list[int]) -> LogprobRequest:
        return LogprobRequest(len(ids) - 1, 2, True)

    reqs = openai_requests([[1, 2], [3]], {"max_new_tokens": 2, "temperature": 0.0}, 2, lp, LIMITS, "cmpl-abc", True)
    assert [r.rid for r in reqs] == ["cmpl-abc-0", "cmpl-abc-1", "cmpl-abc-2", "cmpl-abc-3"]
    assert [r.input_ids for r in reqs] == [[1, 2], [1, 2], [3], [3]] and all(r.stream for r in reqs)
    assert reqs[2].logprob == LogprobRequest(0, 2, True)
    with pytest.raises(ValueError, match="prompts x n") as e:
        openai_requests([[1]] * (MAX_BATCH // 2 + 1), {}, 2, lp, LIMITS, "c", False)
    assert e.value.param == "n"
    with pytest.raises(ValueError, match="prompt must be token ids") as e:
        openai_requests([[1, 500]], {}, 1, lp, LIMITS, "c", False)
    assert e.value.param == "prompt"


def test_bad_input_is_named_at_the_intake():
    with pytest.raises(ValueError, match="unknown sampling parameter"):
        body(text="a", sampling_params={"grammar": "x"})  # the built spec is no request field
    with pytest.raises(ValueError, match="invalid regex"):
        body(text="a", sampling_params={"regex": "(a"})
    with pytest.raises(ValueError, match="stream must be a boolean"):
        body(text="a", stream="yes")


@pytest.mark.parametrize("sp", [
    {"max_new_tokens": 5, "temperature": 0.7, "stop": ["\n", "END"], "stop_regex": r"\d{3}", "logit_bias": {"7": -2},
     "sampling_seed": 11, "stop_token_ids": [3]},
    {"max_new_tokens": 4, "regex": r"\p{L}+ [0-9]{2}"},
    {"max_new_tokens": 4, "allowed_token_ids": [5, 9], "bad_words": ["ab", " c"]},
    {"max_new_tokens": 4, "json_schema": '{"type": "object", "properties": {"a": {"type": "integer"}}}'},
])
def test_the_scheduler_message_round_trips_trusted(sp, monkeypatch):
    (req,), _ = body(input_ids=[1, 2, 3], sampling_params=sp, rid="r", return_logprob=True, logprob_start_len=1,
                     top_logprobs_num=2, stream=True)
    msg = m.decode(m.encode(req.to_message()))
    assert (msg.rid, msg.input_ids, msg.stream, msg.return_logprob, msg.logprob_start_len, msg.top_logprobs_num) == \
        ("r", [1, 2, 3], True, True, 1, 2)

    def no_checks(*a, **k):
        raise AssertionError("the scheduler side validated again")

    monkeypatch.setattr(SamplingParams, "from_dict", classmethod(no_checks))
    monkeypatch.setattr(SamplingParams, "normalize", no_checks)
    import radixlang_runtime.constrained.spec as spec_mod

    monkeypatch.setattr(spec_mod, "spec_from_sampling", no_checks)
    monkeypatch.setattr(spec_mod, "canonical_schema", no_checks)
    monkeypatch.setattr(spec_mod, "check_regex", no_checks)
    got = m.decode(m.encode(msg)).sampling_params  # what the scheduler receives: decoded without checks
    assert type(got) is SamplingParams
    assert got == req.sampling  # every request field, logit_bias keys as ints
    assert got.logit_bias == req.sampling.logit_bias
    assert got.grammar == req.sampling.grammar and (got.grammar is None) == (not req.sampling.constrained)
    if got.grammar is not None:
        assert got.grammar.compile_text == req.sampling.grammar.compile_text and got.grammar.key


def test_bad_words_are_tokenized_once_at_the_intake():
    (req,), _ = body(input_ids=[1], sampling_params={"bad_words": ["ab", " c"]})
    # "ab" -> [97, 98], " ab" -> [32, 97, 98] (another length: dropped); "c" -> [99], " c" -> [32, 99] (dropped)
    assert req.sampling.bad_words_ids == [[97, 98], [99]]
    assert m.decode(m.encode(req.to_message())).sampling_params.bad_words_ids == [[97, 98], [99]]
    with pytest.raises(ValueError, match="needs the tokenizer") as e:  # an entrance without a word encoder
        parse_generate_body({"input_ids": [1], "sampling_params": {"bad_words": ["ab"]}}, encode, LIMITS)
    assert e.value.param == "bad_words"
    with pytest.raises(ValueError, match="allowed_token_ids contains out-of-vocab") as e:
        body(input_ids=[1], sampling_params={"allowed_token_ids": [1, 100]})
    assert e.value.param == "allowed_token_ids"


HIDDEN = RuntimeLimits(context_len=256, vocab_size=100, num_slots=4096, hidden_states=True)


def test_each_prompt_carries_its_own_salt_and_hidden_states_flag():
    reqs, as_list = parse_generate_body({"text": ["ab", "ab", "cd"], "sampling_params": {"n": 2},
                                         "cache_salt": ["s1", "s2", None], "return_hidden_states": [True, False, True]},
                                        encode, HIDDEN)
    assert as_list
    msgs = [m.decode(m.encode(r.to_message())) for r in reqs]  # prompt * n + sample: a prompt's samples share them
    assert [x.cache_salt for x in msgs] == ["s1", "s1", "s2", "s2", None, None]
    assert [x.return_hidden_states for x in msgs] == [True, True, False, False, True, True]
    assert reqs[0].prefix_key == reqs[1].prefix_key != reqs[2].prefix_key  # one prompt, two namespaces
    one, _ = parse_generate_body({"text": ["ab", "cd"], "extra_key": "k", "return_hidden_states": True}, encode,
                                 HIDDEN)  # a single value is every prompt's
    assert [(r.extras.cache_salt, r.extras.return_hidden_states) for r in one] == [("k", True), ("k", True)]
    both, _ = parse_generate_body({"input_ids": [[1], [2]], "extra_key": ["a", "b"], "cache_salt": ["a", None]},
                                  encode, HIDDEN)  # SGLang's name beside vLLM's: they agree where both are given
    assert [r.extras.cache_salt for r in both] == ["a", "b"]
    engine, _ = parse_generate_input(["ab", "cd"], None, None, None, False, None, None, None, encode, HIDDEN,
                                     extras={"cache_salt": ["x", "y"], "return_hidden_states": [False, True]})
    assert [(r.extras.cache_salt, r.extras.return_hidden_states) for r in engine] == [("x", False), ("y", True)]


@pytest.mark.parametrize("fields,param,needle", [
    ({"cache_salt": ["a", "b", "c"]}, "cache_salt", "cache_salt has 3 entries for 2 prompts"),
    ({"extra_key": ["a"]}, "extra_key", "extra_key has 1 entries for 2 prompts"),
    ({"return_hidden_states": [True]}, "return_hidden_states", "return_hidden_states has 1 entries for 2 prompts"),
    ({"cache_salt": ["a", 7]}, "cache_salt[1]", "cache_salt\\[1\\] must be a string"),
    ({"cache_salt": ["", "a"]}, "cache_salt[0]", "cache_salt\\[0\\] must be a non-empty string"),
    ({"cache_salt": ["a", ["b"]]}, "cache_salt[1]", "must be a string"),
    ({"extra_key": ["a", "b"], "cache_salt": ["a", "c"]}, "extra_key[1]", "extra_key\\[1\\] and cache_salt\\[1\\]"),
    ({"return_hidden_states": [True, "yes"]}, "return_hidden_states[1]", "must be a boolean"),
    ({"cache_salt": {"0": "a"}}, "cache_salt", "must be a string"),
])
def test_per_prompt_extras_are_refused_by_name(fields, param, needle):
    with pytest.raises(ValueError, match=needle) as e:
        parse_generate_body({"text": ["ab", "cd"], **fields}, encode, HIDDEN)
    assert e.value.param == param


def test_a_list_needs_a_list_of_prompts_and_the_flag():
    for name, value in (("cache_salt", ["a"]), ("return_hidden_states", [True]), ("extra_key", ["a"])):
        with pytest.raises(ValueError, match=f"{name} as a list gives one value per prompt") as e:
            parse_generate_body({"text": "ab", "sampling_params": {"n": 2}, name: value}, encode, HIDDEN)
        assert e.value.param == name
    with pytest.raises(ValueError, match="--enable-return-hidden-states") as e:  # the server runs without it
        body(text=["ab", "cd"], return_hidden_states=[False, True])
    assert e.value.param == "return_hidden_states[1]"


def test_fan_out_assigns_from_a_base():
    reqs = fan_out([[1], [2]], [{}, {"n": 2}], [None, None], lambda i, ids: None, LIMITS, base_rid="b")
    assert [r.rid for r in reqs] == ["b-0", "b-1", "b-2"]


def test_the_dsl_and_the_runtime_share_one_regex_dialect():
    """gen(regex=) is checked by the runtime's validator: Rust syntax the server takes passes, what it
    refuses is refused when written (before any request)."""
    import radixlang as sgl
    from radixlang.ir import REGEX_INT, SglSamplingParams
    from radixlang_runtime.constrained.spec import DTYPE_REGEX, GrammarSpec

    sgl.gen("a", regex=r"\p{L}+")  # Python's re refuses \p{L}; the runtime (and now the DSL) accept it
    GrammarSpec.from_regex(r"\p{L}+")
    for bad in (r"(?=x)a", r"\bword", "(a"):
        with pytest.raises(ValueError, match="invalid regex"):
            sgl.gen("a", regex=bad)
        with pytest.raises(ValueError, match="invalid regex"):
            GrammarSpec.from_regex(bad)
    assert REGEX_INT == DTYPE_REGEX["int"]
    unset = {f: None for f in SglSamplingParams.__dataclass_fields__}
    out = SglSamplingParams().resolve(SglSamplingParams(**{**unset, "dtype": float}))
    assert out.regex == GrammarSpec.from_dtype("float").source and " " in out.stop
    with pytest.raises(ValueError, match="unknown dtype"):
        SglSamplingParams().resolve(SglSamplingParams(**{**unset, "dtype": list}))


PD = {"bootstrap_host": "10.0.0.2", "bootstrap_port": 8998, "bootstrap_room": 2**63 - 1}


def test_pd_bootstrap_fields_ride_on_the_message():
    lim = RuntimeLimits(context_len=256, vocab_size=100, num_slots=4096, disaggregation_mode="decode")
    reqs, _ = parse_generate_body({"input_ids": [1, 2], **PD}, encode, lim)
    msg = m.decode(m.encode(reqs[0].to_message()))
    assert msg.bootstrap == Bootstrap("10.0.0.2", 8998, 2**63 - 1)
    oai = openai_requests([[1, 2]], {"max_new_tokens": 2}, 1, lambda i, ids: None, lim, "cmpl-x", False,
                          parse_bootstrap(PD, "decode"))
    assert m.decode(m.encode(oai[0].to_message())).bootstrap == Bootstrap("10.0.0.2", 8998, 2**63 - 1)


@pytest.mark.parametrize("mode,body,field,needle", [
    ("null", {"input_ids": [1], "bootstrap_room": 3}, "bootstrap_room", "runs co-located"),
    ("prefill", {"input_ids": [1]}, "bootstrap_host", "needs bootstrap_host, bootstrap_port, bootstrap_room"),
    ("decode", {"input_ids": [1], **PD, "bootstrap_room": -1}, "bootstrap_room", "bootstrap_room"),
    ("decode", {"input_ids": [1], **PD, "bootstrap_port": "x"}, "bootstrap_port", "integer"),
    ("decode", {"input_ids": [[1], [2]], **PD}, "input_ids", "batch input"),
    ("decode", {"input_ids": [[1]], **PD}, "input_ids", "batch input"),
    ("prefill", {"input_ids": [1], "sampling_params": {"n": 2, "temperature": 1}, **PD}, "n", "n > 1"),
])
def test_pd_fields_refused_by_name(mode, body, field, needle):
    lim = RuntimeLimits(context_len=256, vocab_size=100, num_slots=4096, disaggregation_mode=mode)
    with pytest.raises(ValueError, match=needle) as e:
        parse_generate_body(body, encode, lim)
    assert e.value.param == field
