"""A conversation's tool calls and results rendered through chat templates that read them the ways the models'
own templates do: arguments joined to the text with `+` (DeepSeek V3 / R1 / V3.1: they need the JSON text),
read as an object (`| tojson`, GLM-4.5's `.items()`), a call's `id` written as its header (Kimi K2). What is
rendered reads back, with the format's parser, as the same calls. The templates here are small ones written
to those rules."""

from __future__ import annotations

import json

import pytest

from radixlang_runtime.server.chat_render import render_chat
from radixlang_runtime.server.http_common import BadRequest
from radixlang_runtime.server.openai_tools import check_tools, with_parser
from radixlang_runtime.tool_parsers import get_parser

# the arguments as the model wrote them (no spaces): a template that joins them as text keeps them byte for byte
ARGS = '{"city":"Paris","days":2}'
SPACED = '{"city": "Paris", "days": 2}'  # as `| tojson` writes an object
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]

# DeepSeek V3.1's layout; the arguments joined with `+` (an object there is a TypeError)
JOINS_TEXT = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' %}<｜User｜>{{ m.content }}<｜Assistant｜>{% endif -%}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<｜tool▁calls▁begin｜>"
    "{%- for t in m.tool_calls %}{{ '<｜tool▁call▁begin｜>' + t.function.name + '<｜tool▁sep｜>' + t.function.arguments"
    " + '<｜tool▁call▁end｜>' }}{% endfor %}<｜tool▁calls▁end｜>{% endif -%}"
    "{%- if m.role == 'tool' %}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>{% endif -%}"
    "{%- endfor -%}")
# GLM-4.5's layout: each argument from the object, strings as they are, other values as JSON
READS_OBJECT = (
    "{%- for m in messages -%}{%- for t in m.tool_calls or [] -%}<tool_call>{{ t.function.name }}"
    "{%- for k, v in t.function.arguments.items() %}{{ '\\n<arg_key>' + k + '</arg_key>\\n<arg_value>' }}"
    "{{ v if v is string else v | tojson }}</arg_value>{% endfor %}{{ '\\n</tool_call>' }}{% endfor -%}"
    "{%- endfor -%}")
# GLM-4.7's, MiniMax-M2 / M3's, Seed-OSS's, Step3's, DeepSeek V4's, Gemma 4's, FunctionGemma's, dots' and MiniCPM's
# layouts: each argument from the object, like GLM-4.5's
_VALUE = "{{ v if v is string else v | tojson }}"
READS_OBJECT_AS = {
    "glm47": "{%- for m in messages -%}{%- for t in m.tool_calls or [] -%}{{ '<tool_call>' + t.function.name }}"
             "{%- for k, v in t.function.arguments.items() %}<arg_key>{{ k }}</arg_key><arg_value>" + _VALUE
             + "</arg_value>{% endfor %}</tool_call>{% endfor -%}{%- endfor -%}",
    "minimax-m2": "{%- for m in messages -%}{%- if m.tool_calls %}{{ '<minimax:tool_call>\\n' }}"
                  "{%- for t in m.tool_calls %}{{ '<invoke name=\"' + t.function.name + '\">\\n' }}"
                  "{%- for k, v in t.function.arguments.items() %}{{ '<parameter name=\"' + k + '\">' }}" + _VALUE
                  + "{{ '</parameter>\\n' }}{% endfor %}{{ '</invoke>\\n' }}{% endfor %}</minimax:tool_call>"
                  "{% endif -%}{%- endfor -%}",
    "seed_oss": "{%- for m in messages -%}{%- for t in m.tool_calls or [] -%}"
                "{{ '<seed:tool_call>\\n<function=' + t.function.name + '>\\n' }}"
                "{%- for k, v in t.function.arguments.items() %}{{ '<parameter=' + k + '>' }}" + _VALUE
                + "{{ '</parameter>\\n' }}{% endfor %}{{ '</function>\\n</seed:tool_call>' }}{% endfor -%}"
                "{%- endfor -%}",
    "step3": "{%- for m in messages -%}{%- if m.tool_calls %}<｜tool_calls_begin｜>{%- for t in m.tool_calls %}"
             "{{ '<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"' + t.function.name + '\">' }}"
             "{%- for k, v in t.function.arguments.items() %}{{ '<steptml:parameter name=\"' + k + '\">' }}" + _VALUE
             + "</steptml:parameter>{% endfor %}</steptml:invoke><｜tool_call_end｜>{% endfor %}<｜tool_calls_end｜>"
             "{% endif -%}{%- endfor -%}",
    "minimax-m3": "{%- set ns = ']<]minimax[>[' -%}{%- for m in messages -%}{%- if m.tool_calls %}"
                  "{{ ns + '<tool_call>\\n' }}{%- for t in m.tool_calls %}{{ ns + '<invoke name=\"' + t.function.name"
                  " + '\">' }}{%- for k, v in t.function.arguments.items() %}{{ ns + '<' + k + '>' }}" + _VALUE
                  + "{{ ns + '</' + k + '>' }}{% endfor %}{{ ns + '</invoke>\\n' }}{% endfor %}"
                  "{{ ns + '</tool_call>' }}{% endif -%}{%- endfor -%}",
    "deepseekv4": "{%- set dsml = '｜DSML｜' -%}{%- for m in messages -%}{%- if m.tool_calls %}"
                  "{{ '<' + dsml + 'tool_calls>\\n' }}{%- for t in m.tool_calls %}"
                  "{{ '<' + dsml + 'invoke name=\"' + t.function.name + '\">\\n' }}"
                  "{%- for k, v in t.function.arguments.items() %}{{ '<' + dsml + 'parameter name=\"' + k"
                  " + '\" string=\"' + ('true' if v is string else 'false') + '\">' }}" + _VALUE
                  + "{{ '</' + dsml + 'parameter>\\n' }}{% endfor %}{{ '</' + dsml + 'invoke>\\n' }}{% endfor %}"
                  "{{ '</' + dsml + 'tool_calls>' }}{% endif -%}{%- endfor -%}",
    "gemma4": "{%- for m in messages -%}{%- for t in m.tool_calls or [] -%}"
              "{{ '<|tool_call>call:' + t.function.name + '{' }}{%- for k, v in t.function.arguments.items() %}"
              "{{ k + ':' }}{{ '<|\"|>' + v + '<|\"|>' if v is string else v | tojson }}{{ ',' if not loop.last }}"
              "{% endfor %}{{ '}<tool_call|>' }}{% endfor -%}{%- endfor -%}",
    "functiongemma": "{%- for m in messages -%}{%- for t in m.tool_calls or [] -%}"
                     "{{ '<start_function_call>call:' + t.function.name + '{' }}"
                     "{%- for k, v in t.function.arguments.items() %}{{ k + ':' }}"
                     "{{ '<escape>' + v + '<escape>' if v is string else v | tojson }}{{ ',' if not loop.last }}"
                     "{% endfor %}{{ '}<end_function_call>' }}{% endfor -%}{%- endfor -%}",
    "dots": "{%- for m in messages if m.tool_calls -%}{{ '<dots_function_call>\\n' }}{%- for t in m.tool_calls -%}"
            "{{ '<invoke name=\"' + t.function.name + '\">\\n' }}{%- for k, v in t.function.arguments.items() %}"
            "{{ '<parameter name=\"' + k + '\">' }}" + _VALUE + "{{ '</parameter>\\n' }}{% endfor %}"
            "{{ '</invoke>\\n' }}{% endfor %}{{ '</dots_function_call>' }}{%- endfor -%}",
    "minicpm5": "{%- for m in messages -%}{%- for t in m.tool_calls or [] -%}"
                "{{ '<function name=\"' + t.function.name + '\">' }}{%- for k, v in t.function.arguments.items() %}"
                "{{ '<param name=\"' + k + '\">' }}" + _VALUE + "{{ '</param>' }}{% endfor %}{{ '</function>' }}"
                "{% endfor -%}{%- endfor -%}",
}
# Kimi K2's layout: a call's id is its header, a result names the id it answers
ID_HEADERS = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|tool_calls_section_begin|>"
    "{%- for t in m.tool_calls %}<|tool_call_begin|>{{ t.id }}<|tool_call_argument_begin|>"
    "{{ t.function.arguments if t.function.arguments is string else t.function.arguments | tojson }}"
    "<|tool_call_end|>{% endfor %}<|tool_calls_section_end|>{% endif -%}"
    "{%- if m.role == 'tool' %}## Return of {{ m.tool_call_id }}\n{{ m.content }}{% endif -%}"
    "{%- endfor -%}")


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    return AutoTokenizer.from_pretrained(embedded_tokenizer_dir())


def history(calls: list[tuple[str, str, object]]) -> list[dict]:
    """A user turn, an assistant turn with these (id, name, arguments) calls, one result each."""
    return [{"role": "user", "content": "Weather in Paris, and the time?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls]},
            *[{"role": "tool", "tool_call_id": i, "content": "ok"} for i, _, _ in calls]]


def section(text: str, begin: str, end: str) -> str:
    return text[text.index(begin):text.index(end) + len(end)]


def test_a_template_that_joins_arguments_to_its_text_gets_the_json_text_as_sent(tok):
    text, _ = render_chat(tok, history([("call_a", "get_weather", ARGS), ("call_b", "now", {})]), JOINS_TEXT)
    calls = section(text, "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
    assert calls == ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>" + ARGS
                     + "<｜tool▁call▁end｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
                     "<｜tool▁calls▁end｜>")
    got = get_parser("deepseekv31").parse(calls).calls  # what the model wrote reads back the same
    assert [(c.name, c.arguments) for c in got] == [("get_weather", ARGS), ("now", "{}")]


def test_a_template_that_reads_arguments_as_an_object_gets_one(tok):
    text, _ = render_chat(tok, history([("call_a", "get_weather", ARGS)]), READS_OBJECT)
    assert text == ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
                    "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>")
    got = get_parser("glm45").parse(text, schemas={"get_weather": TOOLS[0]["function"]["parameters"]}).calls
    assert [(c.name, json.loads(c.arguments)) for c in got] == [("get_weather", {"city": "Paris", "days": 2})]


@pytest.mark.parametrize("fmt", sorted(READS_OBJECT_AS))
def test_a_history_in_an_object_reading_layout_reads_back_as_its_calls(tok, fmt):
    """The layouts whose templates iterate the arguments object: a rendered history is what the format's parser
    reads back as the same calls (a call with no arguments included)."""
    text, _ = render_chat(tok, history([("call_a", "get_weather", ARGS), ("call_b", "now", "{}")]),
                          READS_OBJECT_AS[fmt])
    assert "Paris" in text and "now" in text
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    got = get_parser(fmt).parse(text, schemas=schemas)
    assert got.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in got.calls] == [("get_weather", json.loads(ARGS)), ("now", {})]


def test_a_template_type_error_is_a_bad_request(tok):
    with pytest.raises(BadRequest, match="the chat template refused these messages"):
        render_chat(tok, [{"role": "user", "content": "hi"}], "{{ messages[0].content + 1 }}")
    with pytest.raises(BadRequest, match="the chat template refused these messages"):  # no argument form helps
        render_chat(tok, history([("call_a", "now", "{}")]), "{{ messages[1].tool_calls[0].function + 1 }}")


def test_kimi_k2_call_ids_are_the_headers_its_template_writes(tok):
    """Kimi K2 numbers its calls across the conversation and its template writes a call's id as the header: the
    reply's ids are `functions.NAME:IDX`, IDX counted on from the calls already in the messages, so the next
    turn renders the headers the model wrote and results naming them."""
    past = history([("functions.get_weather:0", "get_weather", SPACED), ("functions.now:1", "now", "{}")])
    plan = with_parser(check_tools({"tools": TOOLS, "messages": past}), "kimi_k2", None)
    assert plan.past_calls == 2
    output = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:2<|tool_call_argument_begin|>"
              + SPACED + "<|tool_call_end|><|tool_call_begin|>functions.now:3<|tool_call_argument_begin|>{}"
              "<|tool_call_end|><|tool_calls_section_end|>")
    message, finish = plan.message(output, "stop")
    ids = [c["id"] for c in message["tool_calls"]]
    assert ids == ["functions.get_weather:2", "functions.now:3"] and finish == "tool_calls"
    stream = plan.stream()
    deltas = [d for ch in output for d in stream.feed(ch)] + stream.finish()
    assert [tc["id"] for d in deltas for tc in d.get("tool_calls", []) if "id" in tc] == ids

    turn = {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]}
    results = [{"role": "tool", "tool_call_id": i, "content": "ok"} for i in ids]
    text, _ = render_chat(tok, [*past, turn, *results], ID_HEADERS)
    assert output in text  # the history shows the turn as the model wrote it
    assert text.endswith("## Return of functions.get_weather:2\nok## Return of functions.now:3\nok")


def test_other_formats_keep_their_own_call_ids():
    past = history([("call_x", "now", "{}")])
    plan = with_parser(check_tools({"tools": TOOLS, "messages": past}), "deepseekv31", None)
    out = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    (call,) = plan.message(out, "stop")[0]["tool_calls"]
    assert call["id"].startswith("call_")
    kimi = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.now:0<|tool_call_argument_begin|>{}"
            "<|tool_call_end|><|tool_calls_section_end|>")
    assert [c.id for c in get_parser("kimi_k2").parse(kimi).calls] == ["functions.now:0"]
    assert [c.id for c in get_parser("kimi_k2").parse(kimi, past_calls=5).calls] == ["functions.now:5"]
