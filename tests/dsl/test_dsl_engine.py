"""The DSL on the real model in process (`EngineBackend` over the session's Engine): SGLang's test
programs, and select decisions equal to the argmax of scores computed from the Engine's own logprobs."""

from __future__ import annotations

import re

import pytest

import radixlang as sgl
from radixlang import test_programs as tp
from radixlang.backend.engine import EngineBackend
from radixlang.errors import BackendError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def backend(engine_fp32):
    b = EngineBackend(engine=engine_fp32)
    sgl.set_default_backend(b)
    yield b
    sgl.set_default_backend(None)


def run_program(program):
    """Run one of SGLang's programs (the constrained ones too: regex / json / dtype go through the
    runtime's grammar backend)."""
    program()


@pytest.mark.parametrize("program", tp.ALL, ids=lambda f: f.__name__)
def test_program_on_engine(backend, program):
    run_program(program)


def test_run_batch_pins_its_prefix_for_the_batch(backend, monkeypatch):
    unpin, seen = backend.unpin_prefix, []

    def spy(handle):  # the batch's end: its pin is still there, then released
        seen.append((handle, backend.engine.get_stats()))
        unpin(handle)

    monkeypatch.setattr(backend, "unpin_prefix", spy)
    states = tp.few_shot_qa.run_batch([{"question": f"What is the capital of country {i}?"} for i in range(3)],
                                      temperature=0)
    assert all(st.get_meta_info("answer")["cached_tokens"] > 0 for st in states)
    assert len(seen) == 1 and seen[0][1]["num_pins"] == 1 and seen[0][1]["pinned_slots"] > 0, seen
    assert backend.engine.get_stats()["num_pins"] == 0


def test_embedded_model_gets_chatml_with_its_system_prompt(backend):
    t = backend.get_chat_template()
    assert t.name == "chatml" and t.stop_str == ("<|im_end|>",)
    assert "SmolLM" in (t.default_system_prompt or "")


def direct_scores(engine, prompt: str, choices: list[str]) -> list[float]:
    """Mean logprob of each choice's own tokens, read straight from Engine.generate."""
    p_ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
    scores = []
    for c in choices:
        out = engine.generate(prompt + c, {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
        entries = out["meta_info"]["input_token_logprobs"]
        ids = [e[1] for e in entries]
        m = 0
        while m < min(len(p_ids), len(ids)) and ids[m] == p_ids[m]:
            m += 1
        vals = [e[0] for e in entries[m:]]
        scores.append(sum(vals) / len(vals))
    return scores


@pytest.mark.parametrize("prompt", [
    "Determine whether the statement is True or False.\nStatement: Paris is in France.\nAnswer:",
    "The weather today is very very",  # the prompt's last two tokens are equal
])
def test_select_decision_is_the_argmax_of_engine_logprobs(backend, engine_fp32, prompt):
    choices = [" True", " False", " sunny", " cold"]
    want = direct_scores(engine_fp32, prompt, choices)

    @sgl.function
    def prog(s):
        s += prompt + sgl.select("c", choices)

    st = prog.run()
    meta = st.get_meta_info("c")
    assert meta["normalized_prompt_logprobs"] == pytest.approx(want, abs=1e-4)
    assert st["c"] == choices[max(range(len(want)), key=lambda i: want[i])]


@pytest.mark.parametrize("method", [sgl.greedy_token_selection, sgl.unconditional_likelihood_normalized])
def test_other_select_methods_run_on_the_model(backend, method):
    st = tp.true_or_false.run(statement="The sky is green.", method=method)
    assert st["answer"] in ("True", "False", "Unknown")
    assert st.error() is None


def test_refused_request_ends_the_state(backend):
    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a", top_p=5.0)

    st = prog.run()
    assert isinstance(st.error(), BackendError) and st.error().status == 400 and "top_p" in str(st.error())


def test_gen_stop_regex_on_the_runtime(backend):
    @sgl.function
    def count(s):
        s += "Count from 1 to 20: 1, 2, 3,"
        s += sgl.gen("rest", max_tokens=48, temperature=0, stop_regex=r"1[0-9]")

    @sgl.function
    def count_free(s):
        s += "Count from 1 to 20: 1, 2, 3,"
        s += sgl.gen("rest", max_tokens=48, temperature=0)

    free = count_free.run()["rest"]
    first = re.search(r"1[0-9]", free)
    assert first is not None, free  # the model counts past 9
    st = count.run()
    assert st["rest"] == free[: first.start()]
    assert st.get_meta_info("rest")["finish_reason"]["matched"] == first.group(0)


def test_gen_takes_a_pydantic_model_as_its_schema(backend):
    """SGLang's frontend takes `json_schema=` a pydantic model class; the output validates against it."""
    from typing import Literal

    import pydantic

    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=24)
        country: Literal["France", "Germany", "Spain"]
        is_capital: bool

    @sgl.function
    def extract(s):
        s += sgl.user("Describe Paris as JSON: its name, its country, whether it is the capital.")
        s += sgl.assistant(sgl.gen("city", max_tokens=48, temperature=0, json_schema=City))

    state = extract.run(backend=backend)
    city = City.model_validate_json(state["city"])
    assert city.name
