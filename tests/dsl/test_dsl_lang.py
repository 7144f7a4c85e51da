"""The language against the fake backend: gen parameters, roles and messages, variables, fork/join,
run / run_batch, streaming, tracing, chat templates (no model, fast)."""

from __future__ import annotations

import asyncio
import json

import pytest

import radixlang as sgl
from radixlang.backend.fake import FakeBackend
from radixlang.chat_template import get_chat_template, pick_chat_template
from radixlang.tracer import extract_prefix_by_tracing


@pytest.fixture
def fake():
    return FakeBackend(reply=lambda p, sp: " hello world")


def test_every_gen_parameter_reaches_the_request(fake):
    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a", max_tokens=7, min_tokens=2, n=1, stop=["!"], stop_token_ids=[5], stop_regex=r"\d+",
                           temperature=0.5, top_p=0.9, top_k=40, min_p=0.05, frequency_penalty=0.1,
                           presence_penalty=0.2, ignore_eos=True, return_logprob=True, logprob_start_len=0,
                           top_logprobs_num=3, return_text_in_logprobs=True, json_schema={"type": "object"})

    prog.run(backend=fake).sync()
    body = fake.requests[0]
    assert body["sampling_params"] == {
        "skip_special_tokens": True, "spaces_between_special_tokens": True, "max_new_tokens": 7, "min_new_tokens": 2,
        "n": 1, "stop": ["!", "<|im_end|>"], "stop_token_ids": [5], "stop_regex": [r"\d+"], "temperature": 0.5,
        "top_p": 0.9, "top_k": 40, "min_p": 0.05, "frequency_penalty": 0.1, "presence_penalty": 0.2,
        "ignore_eos": True, "json_schema": json.dumps({"type": "object"})}  # unset fields (regex): not sent
    assert (body["return_logprob"], body["logprob_start_len"], body["top_logprobs_num"],
            body["return_text_in_logprobs"]) == (True, 0, 3, True)


def test_run_defaults_apply_where_gen_leaves_none(fake):
    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a", temperature=0.3)

    prog.run(backend=fake, max_new_tokens=9, temperature=0.9, top_k=5, stop="END").sync()
    sp = fake.requests[0]["sampling_params"]
    assert (sp["max_new_tokens"], sp["temperature"], sp["top_k"], sp["stop"]) == (9, 0.3, 5, ["END", "<|im_end|>"])


def test_bad_regex_and_schema_are_refused_when_written():
    with pytest.raises(ValueError, match="invalid regex"):
        sgl.gen("a", regex="(")
    with pytest.raises(ValueError, match="json_schema"):
        sgl.gen("a", json_schema="{not json")


def test_roles_messages_and_the_models_default_system_prompt():
    jinja = ("{% for m in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
             "{{ '<|im_start|>system\\nBe nice.<|im_end|>\\n' }}{% endif %}"
             "{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}{% endfor %}")
    fake = FakeBackend(reply=lambda p, sp: " Hi!<|im_end|>junk",
                       model_info={"model_path": "/m", "chat_template": jinja})

    @sgl.function
    def chat(s):
        s += sgl.user("Hello")
        with s.assistant():
            s += sgl.gen("r")
        s += sgl.user_begin() + "Bye" + sgl.user_end()

    st = chat.run(backend=fake)
    assert st.text() == ("<|im_start|>system\nBe nice.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                         "<|im_start|>assistant\n Hi!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n")
    assert st.messages() == [{"role": "system", "content": "Be nice."}, {"role": "user", "content": "Hello"},
                             {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "Bye"}]


def test_nested_roles_fail_the_state(fake):
    @sgl.function
    def prog(s):
        s += sgl.user_begin() + sgl.assistant_begin()

    assert "nested roles" in str(prog.run(backend=fake).error())


def test_variables_scope_set_contains_meta(fake):
    @sgl.function
    def prog(s):
        with s.var_scope("whole"):
            s += "a" + sgl.gen("g", max_tokens=3) + "b"
        s["manual"] = 42

    st = prog.run(backend=fake)
    assert st["whole"] == "a heb" and st["manual"] == 42 and "g" in st and "zzz" not in st
    assert st.get_meta_info("g")["completion_tokens"] == 3


def test_fork_gather_copy_and_forks_plus_list(fake):
    @sgl.function
    def prog(s):
        s += "Shared prompt. "
        forks = s.fork(2)
        forks += ["left:", "right:"]
        forks += sgl.gen("side", max_tokens=3)
        forks.join()
        with s.copy() as c:
            c += "private" + sgl.gen("p", max_tokens=2)
        s += "end"

    st = prog.run(backend=fake)
    assert st["side"] == [" he", " he"] and st["p"] == [" h"]
    assert st.text() == "Shared prompt. end"
    assert sum(b["sampling_params"] == {"max_new_tokens": 0} for b in fake.requests) == 1  # copy() commits nothing


def test_n_greater_than_one_gives_a_list(fake):
    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a", n=2, max_tokens=3)

    st = prog.run(backend=fake)
    assert st["a"] == [" he", " he"] and st.text() == "x he"


def test_run_batch_tuples_progress_bar_and_generator(fake, capsys):
    @sgl.function
    def prog(s, a, b="B"):
        s += a + b + sgl.gen("g", max_tokens=2)

    states = prog.run_batch([("1",), ("2", "C")], backend=fake, progress_bar=True)
    assert [st.text() for st in states] == ["1B h", "2C h"]
    assert "2/2" in capsys.readouterr().err  # tqdm drew the bar
    gen = prog.run_batch([{"a": str(i)} for i in range(5)], backend=fake, generator_style=True, num_threads=2)
    assert [st.text()[0] for st in gen] == list("01234")
    with pytest.raises(TypeError):
        prog.run_batch([("1", "2", "3")], backend=fake)


def test_bind_fixes_arguments(fake):
    @sgl.function
    def prog(s, a, b):
        s += a + b

    assert prog.bind(b="!").run(a="hi", backend=fake).text() == "hi!"


def test_num_api_spec_tokens_is_refused_not_ignored(fake):
    with pytest.raises(NotImplementedError, match="num_api_spec_tokens=64.*not implemented"):
        @sgl.function(num_api_spec_tokens=64)
        def spec(s):
            s += "x"

    @sgl.function(num_api_spec_tokens=None)  # SGLang's default: accepted
    def plain(s):
        s += "x"

    assert plain.run(backend=fake).text() == "x"


def test_streaming_text_iter_and_async_meta():
    fake = FakeBackend(reply=lambda p, sp: " one two")

    @sgl.function
    def prog(s):
        s += "A:" + sgl.gen("a", return_logprob=True) + " B:" + sgl.gen("b")

    st = prog.run(backend=fake, stream=True)
    assert "".join(st.text_iter("a")) == " one two"
    assert "".join(st.text_iter()) == "A: one two B: one two" == st.text()

    async def collect():
        st2 = prog.run(backend=fake, stream=True)
        return [c async for c in st2.text_async_iter("a", return_meta_data=True)]

    chunks = asyncio.run(collect())
    assert "".join(c for c, _ in chunks) == " one two"
    assert [len(m["output_token_logprobs"]) for _, m in chunks] == [1] * 8


def test_text_iter_without_streaming_yields_once(fake):
    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a", max_tokens=3)

    st = prog.run(backend=fake)
    assert list(st.text_iter()) == ["x he"] and list(st.text_iter("a")) == [" he"]


def test_tracer_finds_the_constant_prefix_with_roles():
    fake = FakeBackend()

    @sgl.function
    def prog(s, question, n):
        s += sgl.system("Be terse.")
        s += sgl.user("Question: " + question)
        s += sgl.assistant(sgl.gen("a"))

    assert extract_prefix_by_tracing(prog, fake) == ("<|im_start|>system\nBe terse.<|im_end|>\n"
                                                     "<|im_start|>user\nQuestion: ")

    @sgl.function
    def uses_str(s, x):
        s += "Start "
        s += str(x) + " end"

    assert extract_prefix_by_tracing(uses_str, fake) == "Start "  # str(argument) stops, never "Argument(...)"

    @sgl.function
    def calls_other(s, x):
        s += "Start "
        prog.run(question="q", n=1, backend=fake)  # would call the backend: stops the trace instead
        s += "never"

    before = len(fake.requests)
    assert extract_prefix_by_tracing(calls_other, fake) == "Start " and len(fake.requests) == before


def test_chat_template_choice():
    assert pick_chat_template(model_path="/x/SmolLM2-135M-Instruct").name == "chatml"
    assert pick_chat_template(model_path="meta-llama/Llama-3-8B-Instruct").name == "llama-3-instruct"
    assert pick_chat_template(model_path="/models/unknown").name == "default"
    assert pick_chat_template("llama-2-chat", jinja_template="<|im_start|>").name == "llama-2-chat"
    t = pick_chat_template(jinja_template="{{ '<|start_header_id|>' }}")
    assert t.name == "llama-3-instruct" and t.stop_str == ("<|eot_id|>",)
    with pytest.raises(ValueError, match="unknown chat template"):
        get_chat_template("nope")
    llama2 = get_chat_template("llama-2-chat")
    assert llama2.get_prompt([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]) == \
        "[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]"


def test_flush_cache_and_server_info(fake):
    sgl.set_default_backend(fake)
    try:
        assert sgl.flush_cache() is True
        assert sgl.get_server_info()["version"] == "fake"
    finally:
        sgl.set_default_backend(None)
