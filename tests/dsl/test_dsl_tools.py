"""Tools in the DSL (radixlang/tools.py): the schema a typed Python function gives, arguments checked against
its signature, the prompt rendered as the server's chat route renders it (transformers' apply_chat_template
on the same template), the forced-call regex, and a program on the scripted FakeBackend: what it sends and
what the variables hold. The embedded model runs examples/dsl_tool_agent.py (tests/dsl/test_dsl_examples.py)."""

from __future__ import annotations

import json
import re
from typing import Literal, Optional

import pytest

import radixlang as sgl
from radixlang.backend.fake import CHATML_JINJA, FakeBackend
from radixlang.tools import ToolRequest, check_arguments, function_tool


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius", days: Optional[int] = None,
                hours: list[int] = (), lat: float = 0.0, metric: bool = True) -> str:
    """Get the weather in a city.

    More text that is not the description.

    Args:
        city: the city's name
        unit (str): the unit
    """
    return city


def now() -> str:
    """The time."""
    return "12:00"


def test_the_schema_comes_from_the_signature_and_the_docstring():
    tool = function_tool(get_weather)
    fn = tool["function"]
    assert tool["type"] == "function" and fn["name"] == "get_weather"
    assert fn["description"] == "Get the weather in a city."
    assert fn["parameters"] == {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "the city's name"},
        "unit": {"enum": ["celsius", "fahrenheit"], "description": "the unit"},
        "days": {"type": ["integer", "null"]}, "hours": {"type": "array", "items": {"type": "integer"}},
        "lat": {"type": "number"}, "metric": {"type": "boolean"}}}
    assert function_tool(now)["function"]["parameters"] == {"type": "object", "properties": {}, "required": []}


def test_unsupported_signatures_are_refused_by_name():
    def untyped(city) -> str:
        return city

    def odd(when: dict) -> str:
        return ""

    def star(*cities: str) -> str:
        return ""

    with pytest.raises(ValueError, match="parameter 'city' needs a type hint"):
        function_tool(untyped)
    with pytest.raises(ValueError, match="parameter 'when': type .*dict.* is not supported"):
        function_tool(odd)
    with pytest.raises(ValueError, match="parameter 'cities' must be passable by keyword"):
        function_tool(star)
    with pytest.raises(ValueError, match="a named Python function"):
        function_tool(lambda x: x)


def test_arguments_are_checked_against_the_signature():
    assert check_arguments(get_weather, {"city": "Oslo", "lat": 3, "hours": [1, 2], "days": None}) == {
        "city": "Oslo", "lat": 3.0, "hours": [1, 2], "days": None}
    bad = [({}, "missing argument 'city'"), ({"city": "x", "town": "y"}, "unknown argument 'town'"),
           ({"city": 3}, "argument 'city' must be string, got 3"),
           ({"city": "x", "unit": "kelvin"}, r"argument 'unit' must be one of \['celsius', 'fahrenheit'\]"),
           ({"city": "x", "hours": [1, "2"]}, r"argument 'hours'\[1\] must be integer"),
           ({"city": "x", "days": True}, "argument 'days' must be integer, got true"),
           ([1], "arguments must be a JSON object")]
    for args, why in bad:
        with pytest.raises(ValueError, match=why):
            check_arguments(get_weather, args)


def test_gen_with_tools_refuses_what_it_cannot_honour():
    with pytest.raises(ValueError, match="tool_choice needs tools"):
        sgl.gen("x", tool_choice="auto")
    with pytest.raises(ValueError, match="cannot be combined with regex"):
        sgl.gen("x", tools=[now], regex="a")
    with pytest.raises(ValueError, match="tool_choice names 'later', which is not in tools"):
        sgl.gen("x", tools=[now], tool_choice={"name": "later"})
    with pytest.raises(ValueError, match="non-empty list of functions"):
        sgl.gen("x", tools=[])


def test_the_prompt_is_what_the_chat_route_renders():
    """The same template through transformers' apply_chat_template (what the server calls)."""
    from transformers import AutoTokenizer

    from radixlang_runtime.chat_tools_template import CHATML_TOOLS_TEMPLATE
    from radixlang_runtime.model.loader.resolve import resolve_model_dir

    tok = AutoTokenizer.from_pretrained(resolve_model_dir(None))
    req = ToolRequest.make([get_weather, now], "auto")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"}]
    text, parser, list_form = req.render(tok.chat_template, messages)
    assert (parser, list_form) == ("hermes", True)
    assert text == tok.apply_chat_template(messages, tools=req.tools, chat_template=CHATML_TOOLS_TEMPLATE,
                                           tokenize=False, add_generation_prompt=True)
    assert json.dumps(req.tools[0]) in text and text.endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="needs the model's Jinja chat template"):
        req.render("{{ messages }}", messages)


def test_the_forced_regex_admits_exactly_calls_of_the_chosen_function():
    req = ToolRequest.make([get_weather, now], {"name": "get_weather"})
    rx = re.compile(req.forced_regex("hermes", True))
    good = '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "fahrenheit"}}\n]</tool_call>'
    assert rx.fullmatch(good)
    assert not rx.fullmatch(good.replace("fahrenheit", "kelvin"))
    assert not rx.fullmatch('<tool_call>[\n{"name": "now", "arguments": {}}\n]</tool_call>')
    assert ToolRequest.make([now], "auto").forced_regex("hermes", True) is None


def _program_backend(reply: str) -> FakeBackend:
    return FakeBackend(reply=lambda prompt, sp: reply, model_info={
        "model_path": "fake-model", "chat_template": CHATML_JINJA})


@sgl.function
def ask(s, choice):
    s += sgl.system("Be brief.")
    s += sgl.user("Weather in Oslo and the time?")
    s += sgl.assistant(sgl.gen("call", tools=[get_weather, now], tool_choice=choice, max_tokens=400))


def test_a_program_gets_call_records_and_sends_the_rendered_tools():
    out = ('<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}},\n'
           '{"name": "now", "arguments": {}}\n]</tool_call>')
    be = _program_backend(out)
    st = ask.run(choice="required", backend=be)
    calls = st.tool_calls("call")
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Oslo", "days": 2}), ("now", {})]
    assert st["call"] is calls[0] and calls[0].id.startswith("call_")
    sent = be.requests[-1]
    assert "<tools>" in sent["text"] and sent["text"].endswith("<|im_start|>assistant\n")
    assert re.fullmatch(sent["sampling_params"]["regex"], out)
    assert st.text().endswith(out + "<|im_end|>\n")  # the program's text keeps the model's output


def test_a_text_answer_and_a_call_with_bad_arguments():
    st = ask.run(choice="auto", backend=_program_backend("It is sunny."))
    assert st["call"] == "It is sunny." and st.tool_calls("call") == []
    bad = ask.run(choice="auto", backend=_program_backend(
        '<tool_call>[\n{"name": "get_weather", "arguments": {"city": 7}}\n]</tool_call>'))
    with pytest.raises(sgl.ProgramError, match="argument 'city' must be string, got 7"):
        bad["call"]


def test_gen_with_tools_outside_an_assistant_turn_is_an_error():
    @sgl.function
    def loose(s):
        s += "Q: " + sgl.gen("call", tools=[now])

    st = loose.run(backend=_program_backend("x"))
    with pytest.raises(sgl.ProgramError, match=r"must be inside sgl.assistant"):
        st["call"]
