"""The DSL's sampling_params are exactly what the server's one intake parses: the field list is
one (radixlang_runtime/protocol/sampling_fields.py), every gen field maps onto it, and the dict the DSL sends is parsed
by SamplingParams.from_dict to the same values. gen(ebnf=) travels; separate_reasoning splits with the
runtime's (torch-free) reasoning parser, on the fake backend."""

from __future__ import annotations

import dataclasses

import pytest

import radixlang as sgl
from radixlang.backend.fake import FakeBackend
from radixlang.ir import _NOT_SAMPLING, SglSamplingParams
from radixlang_runtime.protocol.sampling_fields import REQUEST_FIELDS
from radixlang_runtime.protocol.sampling_params import _NOT_REQUEST_FIELDS, SamplingParams


def test_the_field_list_is_the_intakes():
    assert REQUEST_FIELDS == {f.name for f in dataclasses.fields(SamplingParams)} - _NOT_REQUEST_FIELDS
    dsl = {f.name for f in dataclasses.fields(SglSamplingParams)}
    assert dsl - REQUEST_FIELDS == _NOT_SAMPLING  # every other gen field is a sampling_params field


def test_what_the_dsl_sends_the_intake_parses_to_the_same_values():
    p = SglSamplingParams(max_new_tokens=7, min_new_tokens=1, n=2, stop=("a", "b"), stop_token_ids=(3,),
                          stop_regex=("x+",), temperature=0.5, top_p=0.9, top_k=5, min_p=0.1,
                          frequency_penalty=0.2, presence_penalty=0.3, ignore_eos=True, ebnf='root ::= "yes"')
    wire = p.to_runtime_kwargs(skip_special_tokens=False)
    assert set(wire) <= REQUEST_FIELDS and "regex" not in wire and "json_schema" not in wire  # unset: left out
    sp = SamplingParams.from_dict(wire)
    for name in wire:
        assert getattr(sp, name) == wire[name], name
    assert sp.ebnf == 'root ::= "yes"' and sp.grammar_kind == "ebnf"


def test_gen_ebnf_reaches_the_request_and_a_bad_one_is_named():
    fake = FakeBackend()

    @sgl.function
    def f(s):
        s += "Answer:" + sgl.gen("a", max_tokens=3, ebnf='root ::= "yes" | "no"')

    f.run(backend=fake).sync()
    assert fake.requests[-1]["sampling_params"]["ebnf"] == 'root ::= "yes" | "no"'
    with pytest.raises(TypeError, match="ebnf"):
        sgl.gen("a", ebnf={"root": "x"})


@pytest.mark.parametrize("reply,answer,reasoning", [
    ("Let me think.\n</think>\n\nParis", "Paris", "Let me think."),  # deepseek-r1: the template opened <think>
    (" Paris", " Paris", "Paris"),  # no </think>: all reasoning (cut off while thinking), as the parser says
])
def test_separate_reasoning_splits_the_variable_and_the_text(reply, answer, reasoning):
    fake = FakeBackend(reply=lambda prompt, sp: reply)

    @sgl.function
    def f(s):
        s += "Q: capital of France?\nA:" + sgl.separate_reasoning(sgl.gen("answer", max_tokens=30), "deepseek-r1")
        s += "\nDone."

    st = f.run(backend=fake)
    from radixlang_runtime.reasoning_parser import get_reasoning_parser

    split = get_reasoning_parser("deepseek-r1").parse(reply)
    assert st["answer"] == split.content and st["answer_reasoning_content"] == split.reasoning
    assert st.text() == "Q: capital of France?\nA:" + split.content + "\nDone."


def test_separate_reasoning_needs_a_name_and_a_known_parser():
    with pytest.raises(ValueError, match="named gen"):
        sgl.separate_reasoning(sgl.gen(max_tokens=3), "deepseek-r1")

    @sgl.function
    def f(s):
        s += sgl.separate_reasoning(sgl.gen("a", max_tokens=3), "no-such-parser")

    st = f.run(backend=FakeBackend())
    with pytest.raises(Exception, match="unknown reasoning parser 'no-such-parser'"):
        st.sync()
        st["a_reasoning_content"]
