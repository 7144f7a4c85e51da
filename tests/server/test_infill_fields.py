"""llama.cpp's /infill fields (server/infill_fields.py): the limits, response_fields' paths, samplers against
the server's sampler order, and penalty_last_n's two windows; each refusal names its field."""

from __future__ import annotations

import pytest

from radixlang_runtime.protocol.limits import FieldError
from radixlang_runtime.server.infill_fields import (apply_penalty_last_n, apply_samplers, limits, pick,
                                                    response_fields)


def test_limits():
    assert limits({}) == {"n_indent": 0, "t_max_prompt_ms": 0, "t_max_predict_ms": 0}
    assert limits({"n_indent": 4, "t_max_prompt_ms": 500, "t_max_predict_ms": -1}) == {
        "n_indent": 4, "t_max_prompt_ms": 500, "t_max_predict_ms": 0}
    for name in ("n_indent", "t_max_prompt_ms", "t_max_predict_ms"):
        with pytest.raises(FieldError) as e:
            limits({name: 1.5})
        assert e.value.param == name


def test_response_fields_pick_paths_flat():
    answer = {"content": "x", "stop": True, "timings": {"prompt_n": 3, "predicted_ms": 1.5}}
    paths = response_fields(["content", "timings/prompt_n", "timings/nothing", "nothing/at/all", "timings"])
    assert pick(answer, paths) == {"content": "x", "timings/prompt_n": 3, "timings": answer["timings"]}
    assert pick(answer, response_fields([])) is answer  # empty: the whole answer, as llama.cpp
    assert pick(answer, response_fields(None)) is answer
    for bad in ("content", [1], ["x"] * 65):
        with pytest.raises(FieldError) as e:
            response_fields(bad)
        assert e.value.param == "response_fields"


def test_samplers_set_left_out_stages_neutral():
    sampling = {"temperature": 0.7, "top_k": 40, "top_p": 0.99, "min_p": 0.05}
    apply_samplers(["top_k", "top_p"], {"top_k": 40, "top_p": 0.99}, sampling)
    assert sampling == {"temperature": 1.0, "top_k": 40, "top_p": 0.99, "min_p": 0.0}
    sampling = {"temperature": 0.2}
    apply_samplers(["temperature", "top_k", "top_p", "min_p"], {}, sampling)
    assert sampling == {"temperature": 0.2}
    sampling = {"min_p": 0.0}
    apply_samplers(None, {}, sampling)
    assert sampling == {"min_p": 0.0}


def test_infill_closes_the_list():
    """llama.vim's list: temperature and min_p neutral, top_k and top_p as sent, the infill stage on."""
    sampling = {"temperature": 0.7, "top_k": 40, "top_p": 0.99, "min_p": 0.05}
    apply_samplers(["top_k", "top_p", "infill"], {"top_k": 40, "top_p": 0.99}, sampling)
    assert sampling == {"temperature": 1.0, "top_k": 40, "top_p": 0.99, "min_p": 0.0, "infill": True}
    sampling = {}
    apply_samplers(["top_k", "top_p"], {}, sampling)
    assert "infill" not in sampling


@pytest.mark.parametrize("samplers, body, words", [
    (["top_p", "infill"], {}, "needs top_k before it"),
    (["infill", "top_k"], {}, "infill runs last"),
    (["top_k", "infill", "infill"], {}, "infill runs last"),
    (["top_k", "dry"], {}, "'dry'"),
    (["top_p", "top_k"], {}, "order"),
    (["top_k", "top_k"], {}, "order"),
    (["top_k"], {"temperature": 0.5}, "leaves out temperature"),
    ("top_k", {}, "list"),
])
def test_samplers_refused(samplers, body, words):
    with pytest.raises(FieldError) as e:
        apply_samplers(samplers, body, {})
    assert e.value.param == "samplers"
    assert words in str(e.value)


def test_penalty_last_n():
    sampling = {"repetition_penalty": 1.1, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    apply_penalty_last_n(0, {}, sampling)  # a model default penalty is turned off too
    assert sampling == {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    sampling = {"repetition_penalty": 1.1}
    apply_penalty_last_n(-1, {"repeat_penalty": 1.1}, sampling)  # the repeat penalty's scope: kept
    assert sampling == {"repetition_penalty": 1.1}
    cases = [(0, {"repeat_penalty": 1.2}), (0, {"presence_penalty": 0.5}), (-1, {"frequency_penalty": 0.1}),
             (64, {}), ("0", {})]
    for n, body in cases:
        with pytest.raises(FieldError) as e:
            apply_penalty_last_n(n, body, {})
        assert e.value.param == "penalty_last_n", (n, body)
