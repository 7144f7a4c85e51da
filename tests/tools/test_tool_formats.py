"""The tool-call formats of Qwen3-Coder (and MiMo), Seed-OSS, DeepSeek V3 / V3.1 / V3.2 / V4, Kimi K2, GLM-4.5 / 4.7,
MiniMax-M2 / M3, LFM2, Gemma 4, FunctionGemma, Kimi K3, dots, MiniCPM and gpt-oss (harmony), on
outputs written exactly as those models emit them (their chat templates' markup and SGLang's / vLLM's
recorded samples). A stream cut anywhere (every split in two, one character at a time, random chunkings)
adds up to the whole-text parse; broken markup stays text."""

from __future__ import annotations

import json

import pytest

from radixlang_runtime.tool_parsers import CallArgs, CallStart, collect, detect_parser, get_parser
from tool_format_cases import (CASES, DSML, K3_ARG, K3_CALL, MALFORMED, NS, SCHEMAS, STEP_CALL, TOOL_NAMES, WEATHER,
                               calls_of, chunkings, stream)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_parse_recorded_outputs(case):
    fmt, text, content, calls = CASES[case]
    got = get_parser(fmt).parse(text, TOOL_NAMES, schemas=SCHEMAS)
    assert got.content == content
    assert calls_of(got) == calls
    assert len({c.id for c in got.calls}) == len(got.calls)


@pytest.mark.parametrize("case", range(len(CASES) + len(MALFORMED)))
def test_streamed_deltas_add_up_to_the_parse(case):
    fmt, text = CASES[case][:2] if case < len(CASES) else MALFORMED[case - len(CASES)]
    full = get_parser(fmt).parse(text, TOOL_NAMES, schemas=SCHEMAS)
    for cuts in chunkings(text, case):
        events = stream(fmt, text, cuts)
        got = collect(events)
        assert got.content == full.content, cuts
        assert [(c.name, c.arguments) for c in got.calls] == [(c.name, c.arguments) for c in full.calls], cuts
        starts = [e for e in events if isinstance(e, CallStart)]
        assert [e.index for e in starts] == list(range(len(full.calls)))
        assert all(e.index < len(starts) and e.text for e in events if isinstance(e, CallArgs))


@pytest.mark.parametrize("case", range(len(MALFORMED)))
def test_malformed_calls_stay_text(case):
    fmt, text = MALFORMED[case]
    got = get_parser(fmt).parse(text, TOOL_NAMES, schemas=SCHEMAS)
    assert got.calls == []
    if fmt == "gpt-oss":  # a message's end token is never content
        text = text.removesuffix("<|call|>")
    assert got.content == text.strip()


@pytest.mark.parametrize("fmt", ["qwen3_coder", "glm45", "deepseekv3", "deepseekv31", "kimi_k2", "gpt-oss", "seed_oss",
                                 "glm47", "minimax-m2", "deepseekv32", "step3", "deepseekv4", "minimax-m3",
                                 "lfm2", "gemma4", "kimi_k3", "functiongemma", "dots"])
def test_arguments_stream_in_pieces_and_markup_is_held_back(fmt):
    """Fed a character at a time, a call's arguments arrive in several pieces, and no content delta holds
    any part of the markup."""
    text = next(t for f, t, _, calls in CASES if f == fmt and calls and len(calls[0][1]) >= 1)
    events = stream(fmt, text, list(range(1, len(text))))
    pieces = [e for e in events if isinstance(e, CallArgs) and e.index == 0]
    assert len(pieces) >= 2
    for e in events:
        if not isinstance(e, (CallStart, CallArgs)):
            assert "<" not in e.text and "｜" not in e.text and "]" not in e.text, e


def test_xml_values_follow_the_schema_types_and_read_loosely_without_one():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=zip>\n94103\n</parameter>\n<parameter=days>\n"
            "two\n</parameter>\n<parameter=extra>\n{\"a\": 1}\n</parameter>\n</function>\n</tool_call>")
    typed = get_parser("qwen3_coder").parse(text, schemas=SCHEMAS)
    assert calls_of(typed) == [("get_weather", {"zip": "94103", "days": "two", "extra": {"a": 1}})]
    untyped = get_parser("qwen3_coder").parse(text)
    assert calls_of(untyped) == [("get_weather", {"zip": 94103, "days": "two", "extra": {"a": 1}})]


def test_unknown_function_names_stay_text():
    text = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.rm_rf:0<|tool_call_argument_begin|>{}"
            "<|tool_call_end|><|tool_calls_section_end|>")
    assert get_parser("kimi_k2").parse(text, {"get_weather"}).calls == []
    assert [c.name for c in get_parser("kimi_k2").parse(text).calls] == ["rm_rf"]


def test_template_detection():
    assert detect_parser("{{- '<tool_call>\\n<function=' + tc.name + '>\\n' }}<parameter=") == "qwen3_coder"
    assert detect_parser("<tool_call>{{ tc.name }}<arg_key>{{ k }}</arg_key>") == "glm45"
    assert detect_parser("'<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + name + '\\n```json'") \
        == "deepseekv3"
    assert detect_parser("'<｜tool▁call▁begin｜>' + name + '<｜tool▁sep｜>' + args") == "deepseekv31"
    assert detect_parser("<|tool_calls_section_begin|>") == "kimi_k2"
    assert detect_parser("<|start|>assistant<|channel|>commentary to=functions.{{ name }}") == "gpt-oss"
    # gpt-oss's own template writes the recipient's `to=` and `functions.` NAME as separate strings
    assert detect_parser('{{- "<|start|>assistant to=" }}{{- "functions." + name + "<|channel|>commentary " }}') \
        == "gpt-oss"
    # Kimi K2's first template declares the tools and writes no call markup
    assert detect_parser("{% if tools %}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>") \
        == "kimi_k2"
    assert detect_parser("{% if tools %}<tool_call>{{ t }}</tool_call>{% endif %}") == "hermes"
    # Seed-OSS writes Qwen3-Coder's tags in its own block; GLM-4.7 writes GLM-4.5's tags back to back
    assert detect_parser("{{ '<seed:tool_call>\\n<function=' + name + '>\\n' }}<parameter=") == "seed_oss"
    assert detect_parser("{{- '<tool_call>' + tc.name -}}{% for k, v in _args.items() %}<arg_key>{{ k }}</arg_key>"
                         "<arg_value>{{ v }}</arg_value>{% endfor %}</tool_call>") == "glm47"
    assert detect_parser("{{- '<minimax:tool_call>' + '\\n' }}{{- '<invoke name=\"' + tool_call.name + '\">' }}") \
        == "minimax-m2"
    assert detect_parser("'<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"' + name") == "step3"
    assert detect_parser("{%- set dsml_token = '｜DSML｜' %}{{ '<' + dsml_token + 'function_calls>' }}") \
        == "deepseekv32"
    assert detect_parser("{%- set dsml_token = '｜DSML｜' %}{{ '\\n\\n<' + dsml_token + 'tool_calls>\\n' }}") \
        == "deepseekv4"
    assert detect_parser("{{- '<|tool_call>call:' + function['name'] + '{' -}}") == "gemma4"
    assert detect_parser("{{- ns_token + '<tool_call>' }}{%- set ns_token = ']<]minimax[>[' %}") == "minimax-m3"
    assert detect_parser("List of tools: [{{ tools }}]{{ '<|tool_call_start|>' + calls + '<|tool_call_end|>' }}") \
        == "lfm2"
    # Granite 3.0's token; its 3.1 text form `<tool_call>` reads as Hermes' block
    assert detect_parser("{%- elif thinking %}{{ '<|tool_call|>' + message.tool_calls | tojson }}") == "granite"
    assert detect_parser("{{ '<|action_start|><|plugin|>\\n' + call | tojson + '<|action_end|>' }}") == "internlm"
    assert detect_parser("<|END_THINKING|><|START_ACTION|>{{ tool_calls | tojson }}<|END_ACTION|>") \
        == "cohere_command4"
    assert detect_parser("{{ '<|open|>tools<|sep|>' }}{{ '<|close|>tools<|sep|>' }}") == "kimi_k3"
    assert detect_parser("{{ ' functools[' + calls | tojson + ']' }}") == "phi4_mini_json"
    assert detect_parser("{{ '<function_calls>\\n' + call + '\\n</function_calls>' }}") == "olmo3"
    assert detect_parser("{{ '<tool_calls>' + calls + '</tool_calls>' }}") is None  # Jamba, MiniMax-M1, MiMo differ
    assert detect_parser("{{- '<start_function_call>call:' + tool_call['name'] + '{' -}}") == "functiongemma"
    assert detect_parser("{{ '<longcat_tool_call>\\n' + call | tojson + '\\n</longcat_tool_call>' }}") == "longcat"
    assert detect_parser("{{ role + '<|role_sep|>\\n' + content + '<|message_sep|>\\n\\n' }}") == "gigachat3"
    assert detect_parser("{{- '<|tools_prefix|>' + calls | tojson + '<|tools_suffix|>' -}}") == "apertus"
    assert detect_parser("{{- '<dots_function_call>\\n<invoke name=\"' + tc.name + '\">' }}") == "dots"


def test_vllm_names_are_aliases():
    assert get_parser("minimax_m2") is get_parser("minimax-m2")
    assert get_parser("deepseek_v32") is get_parser("deepseekv32")
    assert get_parser("deepseek_v4") is get_parser("deepseekv4")
    assert get_parser("minimax_m3") is get_parser("minimax-m3")
    # names SGLang or vLLM give a format here under another name
    assert get_parser("step3p5") is get_parser("qwen3_xml") is get_parser("qwen3_coder")
    assert get_parser("glm") is get_parser("glm45") and get_parser("openai") is get_parser("gpt-oss")
    assert get_parser("llama3_json") is get_parser("llama4_json") is get_parser("llama3")
    assert get_parser("ernie45") is get_parser("hermes") and get_parser("mimo") is get_parser("qwen3_coder")
    assert get_parser("apertus2509") is get_parser("apertus")
    assert get_parser("cohere_command3") is get_parser("cohere_command4")  # Command A's action block


def test_minimax_values_follow_the_schema_as_sglang_reads_them():
    """MiniMax-M2: newlines around a value are layout; `null` is None; an enum member is itself whether
    written as text or JSON; integer before number before boolean; a whole number is an integer; booleans
    also read from yes / no / 1 / 0; no schema: text."""
    schema = {"type": "object", "properties": {
        "n": {"type": "number"}, "i": {"type": ["integer", "string"]}, "b": {"type": "boolean"},
        "e": {"enum": ["c", "f", None]}, "o": {"type": "object"}, "s": {"type": "string"},
        "a": {"anyOf": [{"type": "array"}, {"type": "null"}]}}}
    values = [("n", "2.0", 2), ("n", "-1.5", -1.5), ("n", "NaN", "NaN"), ("i", "7", 7), ("i", "seven", "seven"),
              ("b", "yes", True), ("b", "0", False), ("e", "c", "c"), ("e", '"f"', "f"), ("e", "null", None),
              ("o", '{"k": [1]}', {"k": [1]}), ("o", "{bad", "{bad"), ("s", "\n 42 \n\n", " 42 "), ("s", "NULL", None),
              ("a", "[1, 2]", [1, 2]), ("x", "[1, 2]", "[1, 2]")]
    text = "<minimax:tool_call>\n" + "".join(f'<invoke name="f">\n<parameter name="{k}">{raw}</parameter>\n</invoke>\n'
                                              for k, raw, _ in values) + "</minimax:tool_call>"
    got = get_parser("minimax-m2").parse(text, schemas={"f": schema})
    assert calls_of(got) == [("f", {k: v}) for k, _, v in values]


def test_dsml_string_flags_say_text_or_json():
    """`string="true"`: the text as written (digits stay a string); `"false"`: JSON, or the text where it is not
    JSON (SGLang's fallback)."""
    def param(key: str, flag: str, raw: str) -> str:
        return f'<{DSML}parameter name="{key}" string="{flag}">{raw}</{DSML}parameter>\n'

    text = (f'<{DSML}function_calls>\n<{DSML}invoke name="get_weather">\n' + param("zip", "true", "007")
            + param("days", "false", "7") + param("hours", "false", "[1, 2]") + param("city", "false", "Oslo, N")
            + param("unit", "false", "null") + param("lat", "true", " 1.5 ")
            + f"</{DSML}invoke>\n</{DSML}function_calls>")
    got = get_parser("deepseekv32").parse(text, TOOL_NAMES, schemas=SCHEMAS)
    assert calls_of(got) == [("get_weather", {"zip": "007", "days": 7, "hours": [1, 2], "city": "Oslo, N",
                                              "unit": None, "lat": " 1.5 "})]


def test_a_dsml_json_body_that_breaks_stays_text():
    """DeepSeek V3.2's JSON-object body commits at its `{` (a stream has sent the call, the documented limit);
    parse() sees the break and leaves the whole group as text."""
    text = (f'<{DSML}function_calls>\n<{DSML}invoke name="get_weather">\n{{"city": "Paris",}}\n</{DSML}invoke>\n'
            f"</{DSML}function_calls>")
    got = get_parser("deepseekv32").parse(text, TOOL_NAMES)
    assert got.calls == [] and got.content == text
    assert [e.name for e in stream("deepseekv32", text, list(range(1, len(text)))) if isinstance(e, CallStart)] \
        == ["get_weather"]


# ------------------------------------------------------------------------------------ properties
from hypothesis import given, settings, strategies as st  # noqa: E402

_text_values = st.text(st.characters(blacklist_characters="<", blacklist_categories=("Cs",)), max_size=12)
_params = st.fixed_dictionaries({}, optional={"city": _text_values, "days": st.integers(-99, 99),
                                              "hours": st.lists(st.integers(0, 23), max_size=3)})
_xml_calls = st.lists(st.tuples(st.sampled_from(["get_weather", "write_file"]), _params), min_size=1, max_size=3)


def _xml(fmt: str, calls: list) -> str:
    def show(v):
        return v if isinstance(v, str) else json.dumps(v)

    if fmt == "qwen3_coder":
        return "\n".join("<tool_call>\n<function=" + n + ">\n" + "".join(
            f"<parameter={k}>\n{show(v)}\n</parameter>\n" for k, v in a.items()) + "</function>\n</tool_call>"
            for n, a in calls)
    if fmt == "seed_oss":
        return "\n".join("<seed:tool_call>\n<function=" + n + ">\n" + "".join(
            f"<parameter={k}>{show(v)}</parameter>\n" for k, v in a.items()) + "</function>\n</seed:tool_call>"
            for n, a in calls)
    if fmt == "glm47":
        return "".join("<tool_call>" + n + "".join(f"<arg_key>{k}</arg_key><arg_value>{show(v)}</arg_value>"
                                                   for k, v in a.items()) + "</tool_call>" for n, a in calls)
    if fmt == "minimax-m2":
        return "<minimax:tool_call>\n" + "".join(f'<invoke name="{n}">\n' + "".join(
            f'<parameter name="{k}">{show(v)}</parameter>\n' for k, v in a.items()) + "</invoke>\n"
            for n, a in calls) + "</minimax:tool_call>"
    if fmt == "step3":
        return "<｜tool_calls_begin｜>\n" + "\n".join(STEP_CALL.format(n, "".join(
            f'<steptml:parameter name="{k}">{show(v)}</steptml:parameter>\n' for k, v in a.items()))
            for n, a in calls) + "\n<｜tool_calls_end｜>"
    if fmt in ("deepseekv32", "deepseekv4", "dsml-untagged"):
        wrapper = {"deepseekv32": "function_calls", "deepseekv4": "tool_calls"}.get(fmt)
        body = "".join(f'<{DSML}invoke name="{n}">\n' + "".join(
            f'<{DSML}parameter name="{k}" string="{str(isinstance(v, str)).lower()}">{show(v)}</{DSML}parameter>\n'
            for k, v in a.items()) + f"</{DSML}invoke>\n" for n, a in calls)
        return f"<{DSML}{wrapper}>\n{body}</{DSML}{wrapper}>" if wrapper else body
    if fmt == "kimi_k3":  # each value tagged with its JSON type
        kinds = {str: "string", int: "integer", list: "array"}
        return "<|open|>tools<|sep|>" + "".join(K3_CALL.format(n, i + 1, "".join(
            K3_ARG.format(k, kinds[type(v)], show(v)) for k, v in a.items())) for i, (n, a) in enumerate(calls)) \
            + "<|close|>tools<|sep|>"
    if fmt == "dots":  # a group, or a group a call
        calls_xml = [f'<invoke name="{n}">\n' + "".join(f'<parameter name="{k}">{show(v)}</parameter>\n'
                                                         for k, v in a.items()) + "</invoke>\n" for n, a in calls]
        return "<dots_function_call>\n" + "".join(calls_xml) + "</dots_function_call>" if len(calls) % 2 else \
            "\n".join(f"<dots_function_call>\n{c}</dots_function_call>" for c in calls_xml)
    if fmt == "minicpm5":  # as an XML writer escapes text: `&` as `&amp;`
        return "".join(f'<function name="{n}">' + "".join(
            f'<param name="{k}">{show(v).replace("&", "&amp;")}</param>' for k, v in a.items()) + "</function>"
            for n, a in calls)
    if fmt == "minimax-m3":  # as MiniMax-M3's renderer writes calls: lists as <item> tags
        def m3(v):
            if isinstance(v, list):
                return "".join(f"{NS}<item>{m3(x)}{NS}</item>" for x in v)
            return show(v)

        return f"{NS}<tool_call>\n" + "".join(f'{NS}<invoke name="{n}">' + "".join(
            f"{NS}<{k}>{m3(v)}{NS}</{k}>" for k, v in a.items()) + f"{NS}</invoke>\n" for n, a in calls) \
            + f"{NS}</tool_call>"
    return "\n".join("<tool_call>" + n + "\n" + "".join(
        f"<arg_key>{k}</arg_key>\n<arg_value>{show(v)}</arg_value>\n" for k, v in a.items()) + "</tool_call>"
        for n, a in calls)


@settings(max_examples=120, deadline=None)
@given(fmt=st.sampled_from(["qwen3_coder", "glm45", "seed_oss", "glm47", "minimax-m2", "deepseekv32", "step3",
                            "deepseekv4", "dsml-untagged", "minimax-m3", "kimi_k3", "dots", "minicpm5"]),
       calls=_xml_calls, lead=st.sampled_from(["", "Calling.\n"]), data=st.data())
def test_any_xml_calls_read_back_typed_and_stream_the_same(fmt, calls, lead, data):
    """String parameters come back exactly as written (qwen3_coder, seed_oss, minimax-m2, deepseekv32 / v4: but
    for newlines of layout on each side, which a value cannot start or end with here; step3: any whitespace
    there; dots / minicpm5: any whitespace there (Python's); minimax-m2 / dots: but for `null`, None in any type;
    minimax-m3 / kimi_k3: whole), integers and lists by the schema's types (kimi_k3: by their type tag).
    dsml-untagged: DeepSeek's invoke blocks without a wrapper, read by both DSML parsers."""
    edge = {"step3": " \t\n\r\x0b\x0c", "minimax-m3": "", "kimi_k3": "", "dots": None, "minicpm5": None}.get(fmt, "\n")
    calls = [(n, {k: v.strip(edge) if isinstance(v, str) else v for k, v in a.items()}) for n, a in calls]
    if fmt in ("minimax-m2", "dots"):
        calls = [(n, {k: None if isinstance(v, str) and v.lower() == "null" else v for k, v in a.items()})
                 for n, a in calls]
    schemas = {"get_weather": WEATHER, "write_file": WEATHER}
    text = lead + _xml(fmt, calls)
    if fmt == "dsml-untagged":
        fmt = data.draw(st.sampled_from(["deepseekv32", "deepseekv4"]))
    got = get_parser(fmt).parse(text, schemas=schemas)
    assert calls_of(got) == calls
    assert got.content == lead.strip()
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=20)))
    p = get_parser(fmt)(None, schemas=schemas)
    events, prev = [], 0
    for c in [*cuts, len(text)]:
        events += p.feed(text[prev:c])
        prev = c
    streamed = collect(events + p.finish())
    assert streamed.content == got.content
    assert [(c.name, c.arguments) for c in streamed.calls] == [(c.name, c.arguments) for c in got.calls]
