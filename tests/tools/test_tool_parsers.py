"""Tool-call parsers on outputs written the way each model family writes them (from the formats'
documentation: Qwen2.5 / Hermes 2 Pro, SmolLM2's function-calling data, Llama 3.1 JSON, Mistral,
Llama 3.2 / 4 pythonic, LongCat-Flash, GigaChat 3, Apertus, Cohere Command A). Streaming in any chunking must add
up to the non-streaming parse."""

from __future__ import annotations

import json
import random
import re

import pytest

from radixlang_runtime.tool_parsers import (ALIASES, PARSERS, CallArgs, CallStart, Text, collect, detect_parser,
                                            get_parser, openai_delta)
from radixlang_runtime.tool_parsers.json_scan import COMPLETE, INVALID, PARTIAL, JsonScanner, scan_json
from tool_format_cases import calls_of, stream as stream_in

QWEN_PARALLEL = (
    "<tool_call>\n"
    '{"name": "get_current_temperature", "arguments": {"location": "San Francisco, CA, USA"}}\n'
    "</tool_call>\n"
    "<tool_call>\n"
    '{"name": "get_temperature_date", "arguments": {"location": "San Francisco, CA, USA", "date": "2024-10-01"}}\n'
    "</tool_call>"
)
# (format, output, expected content, expected [(name, arguments)])
CASES = [
    ("hermes", QWEN_PARALLEL, "", [("get_current_temperature", {"location": "San Francisco, CA, USA"}),
                                   ("get_temperature_date", {"location": "San Francisco, CA, USA",
                                                             "date": "2024-10-01"})]),
    # Hermes 2 Pro writes "arguments" before "name"
    ("hermes", 'I will look that up.\n<tool_call>\n{"arguments": {"symbol": "TSLA"}, "name": "get_stock_fundamentals"}'
               "\n</tool_call>", "I will look that up.", [("get_stock_fundamentals", {"symbol": "TSLA"})]),
    # SmolLM2: a JSON list in one block; an empty list is no call
    ("hermes", '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Z\u00fcrich"}},\n'
               '{"name": "get_time", "arguments": {"tz": "Europe/Zurich"}}\n]</tool_call>', "",
     [("get_weather", {"city": "Z\u00fcrich"}), ("get_time", {"tz": "Europe/Zurich"})]),
    ("hermes", "<tool_call>[]</tool_call>", "", []),
    # ended by a stop at </tool_call> (the tag not in the text)
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": [1, {"b": null}], "s": "x\\"y"}}\n', "",
     [("f", {"a": [1, {"b": None}], "s": 'x"y'})]),
    ("hermes", "The answer is 4. A <tool> tag and <tool_call without its bracket stay text.",
     "The answer is 4. A <tool> tag and <tool_call without its bracket stay text.", []),
    ("llama3", '{"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA", '
               '"unit": "Fahrenheit"}}', "",
     [("get_current_conditions", {"location": "San Francisco, CA", "unit": "Fahrenheit"})]),
    ("llama3", '<|python_tag|>{"name": "search", "parameters": {"query": "llama"}}; '
               '{"name": "search", "parameters": {"query": "alpaca"}}<|eom_id|>', "",
     [("search", {"query": "llama"}), ("search", {"query": "alpaca"})]),
    ("llama3", 'Here is JSON: {"name": "f", "parameters": {}}', 'Here is JSON: {"name": "f", "parameters": {}}', []),
    ("llama3", '{"answer": 42}', '{"answer": 42}', []),
    ("mistral", '[TOOL_CALLS] [{"name": "get_current_weather", "arguments": {"location": "Paris, France", '
                '"format": "celsius"}}]', "",
     [("get_current_weather", {"location": "Paris, France", "format": "celsius"})]),
    ("mistral", 'Checking both.[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]',
     "Checking both.", [("a", {"x": 1}), ("b", {})]),
    ("pythonic", "[get_user_info(user_id=7890, special='black')]", "",
     [("get_user_info", {"user_id": 7890, "special": "black"})]),
    ("pythonic", '[get_weather(city="San Francisco", metric=True, days=[1, 2], extra={"k": (1, 2)}), get_time()]', "",
     [("get_weather", {"city": "San Francisco", "metric": True, "days": [1, 2], "extra": {"k": [1, 2]}}),
      ("get_time", {})]),
    ("pythonic", "<|python_start|>[lookup(q='a, b) c')]<|python_end|>", "", [("lookup", {"q": "a, b) c"})]),
    ("pythonic", "[1, 2, 3] are numbers", "[1, 2, 3] are numbers", []),
    # Granite 3.0's token, 3.1's string, or the bare list, at the output's start
    ("granite", '<|tool_call|>[{"name": "get_current_weather", "arguments": {"city": "Boston", "unit": "c"}}, '
                '{"name": "now", "arguments": {}}]', "",
     [("get_current_weather", {"city": "Boston", "unit": "c"}), ("now", {})]),
    ("granite", '<tool_call> [{"name": "f", "arguments": {"a": [1]}}]', "", [("f", {"a": [1]})]),
    ("granite", '[{"name": "f", "arguments": {}}]', "", [("f", {})]),
    ("granite", 'Sure: [{"name": "f", "arguments": {}}]', 'Sure: [{"name": "f", "arguments": {}}]', []),
    # Phi-4-mini: anywhere in the output; "parameters" read as "arguments"
    ("phi4_mini_json", 'I will check. functools[{"name": "get_weather", "arguments": {"city": "Rome"}}, '
                       '{"name": "now", "parameters": {}}]', "I will check.",
     [("get_weather", {"city": "Rome"}), ("now", {})]),
    ("phi4_mini_json", "from functools import partial", "from functools import partial", []),
    # Olmo 3: a call a line in <function_calls>; JSON's true / false / null as values too
    ("olmo3", 'Let me check.\n<function_calls>\nget_weather(city="Paris", metric=true, unit=null, days=[1, 2])\n'
              "now()\n</function_calls>", "Let me check.",
     [("get_weather", {"city": "Paris", "metric": True, "unit": None, "days": [1, 2]}), ("now", {})]),
    ("olmo3", "<function_calls>\nlookup(q='a\\nb', strict=False)", "", [("lookup", {"q": "a\nb", "strict": False})]),
    # xLAM: the whole output, or a fenced / tagged list anywhere
    ("xlam", '[{"name": "get_weather", "arguments": {"city": "Lima"}}, {"name": "now", "arguments": {}}]', "",
     [("get_weather", {"city": "Lima"}), ("now", {})]),
    ("xlam", 'Calling it.\n```json\n[{"name": "now", "arguments": {}}]\n```', "Calling it.", [("now", {})]),
    ("xlam", 'Sure. <tool_call>[{"name": "f", "arguments": {"a": 1}}]</tool_call>', "Sure.", [("f", {"a": 1})]),
    ("xlam", "```python\nprint([1])\n```", "```python\nprint([1])\n```", []),
    # Jamba (and Hunyuan-A13B): a JSON list in <tool_calls>; InternLM2: one object a block
    ("jamba", 'Checking. <tool_calls>[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "now", '
              '"arguments": {}}]</tool_calls>', "Checking.", [("get_weather", {"city": "Oslo"}), ("now", {})]),
    ("hunyuan_a13b", '<tool_calls>[{"name": "f", "arguments": {"a": [1]}}]</tool_calls>', "", [("f", {"a": [1]})]),
    ("internlm", 'Sure.<|action_start|><|plugin|>\n{"name": "get_weather", "parameters": {"city": "Tokyo"}}'
                 '<|action_end|>', "Sure.", [("get_weather", {"city": "Tokyo"})]),
    ("internlm", '<|action_start|> <|plugin|>\n{"name": "f", "arguments": {"a": 1}}<|action_end|>'
                 '<|action_start|> <|plugin|>\n{"name": "g", "parameters": {}}<|action_end|>', "",
     [("f", {"a": 1}), ("g", {})]),
    # Cohere Command 4: the list in its action tokens, "tool_name" for the name, the model's id dropped
    ("cohere_command4", 'Checking.<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", '
                        '"parameters": {"city": "Oslo"}},\n    {"tool_call_id": "1", "tool_name": "now", '
                        '"parameters": {}}\n]<|END_ACTION|>', "Checking.",
     [("get_weather", {"city": "Oslo"}), ("now", {})]),
    ("cohere_command4", '<|START_ACTION|>{"tool_name": "f", "parameters": {"a": 1}}<|END_ACTION|>', "",
     [("f", {"a": 1})]),
    # Command A (vLLM's cohere_command3): the same action block, as its template writes it after the reply's text
    ("cohere_command3", 'I will look that up.<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": '
                        '"get_weather", "parameters": {"city": "Oslo", "days": 2}}\n]<|END_ACTION|>',
     "I will look that up.", [("get_weather", {"city": "Oslo", "days": 2})]),
    # Granite 4.0 writes Hermes' blocks, ERNIE-4.5 too (after its reasoning)
    ("granite4", 'Checking.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', "Checking.",
     [("f", {"a": 1})]),
    ("ernie45", 'I will check.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Beijing"}}\n'
                '</tool_call>\n', "I will check.", [("get_weather", {"city": "Beijing"})]),
    # LongCat-Flash: Hermes' object in its own tags, blocks back to back; the close tag may be cut off
    ("longcat", 'Let me check.\n<longcat_tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
                '</longcat_tool_call><longcat_tool_call>\n{"name": "now", "arguments": {}}\n</longcat_tool_call>',
     "Let me check.", [("get_weather", {"city": "Oslo"}), ("now", {})]),
    ("longcat", '<longcat_tool_call>\n{"name": "f", "arguments": {"a": [1]}}\n', "", [("f", {"a": [1]})]),
    ("longcat", "A <tool_call> and <longcat_tool_ stay text.", "A <tool_call> and <longcat_tool_ stay text.", []),
    # GigaChat 3: the separator and the `function call` role, `</s>` after the object; 3.1's single token
    ("gigachat3", "I'll remember that.<|message_sep|>\n\nfunction call<|role_sep|>\n{\"name\": \"remember\", "
                  '"arguments": {"action": "create", "content": {"short": true}}}</s>', "I'll remember that.",
     [("remember", {"action": "create", "content": {"short": True}})]),
    ("gigachat3", '<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "now", "arguments": {}}', "",
     [("now", {})]),
    ("gigachat3", 'Sure.<|function_call|>{"name": "f", "arguments": {"a": 1}}', "Sure.", [("f", {"a": 1})]),
    ("gigachat3", "A function call is a request.", "A function call is a request.", []),
    # Apertus: a list of {NAME: arguments} objects in its special tokens (or one object without the list)
    ("apertus", 'I will check. <|tools_prefix|>[{"get_weather": {"city": "Paris", "days": [1, 2]}}, {"now": {}}]'
                "<|tools_suffix|>", "I will check.", [("get_weather", {"city": "Paris", "days": [1, 2]}), ("now", {})]),
    ("apertus", '<|tools_prefix|>{"f": {"a": {"b": null}}}', "", [("f", {"a": {"b": None}})]),
]
# tool markup that is broken: parse() leaves each whole as text. Early: the break shows before the call
# commits (a stream agrees); late: after (a stream has sent the call: the documented limit).
MALFORMED_EARLY = [
    ("hermes", "<tool_call>\n{name: f}\n</tool_call>"),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": "not an object"}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"arguments": {"a": 1,}, "name": "f"}\n</tool_call>'),
    ("mistral", '[TOOL_CALLS] {"name": "f", "arguments": {}}'),
    ("pythonic", "[f(1)]"),
    ("pythonic", "[f(a=open('x'))]"),
    ("granite", '<|tool_call|>{"name": "f", "arguments": {}}'),  # not a list
    ("phi4_mini_json", 'functools[{"name": "f", "arguments": [1]}]'),
    ("olmo3", "<function_calls>\nf(a=nil)\n</function_calls>"),  # not a literal
    ("jamba", '<tool_calls>{"name": "f", "arguments": {}}</tool_calls>'),  # not a list
    ("cohere_command4", '<|START_ACTION|>[{"tool_call_id": "0", "name": "f", "parameters": {}}]<|END_ACTION|>'),
    ("cohere_command3", '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f", "parameters": "a=1"}]'
                        '<|END_ACTION|>'),  # the parameters not an object
    ("internlm", '<|action_start|><|interpreter|>\nprint(1)<|action_end|>'),  # not a plugin call
    ("xlam", '```json\n{"name": "f", "arguments": {}}\n```'),  # not a list
    ("longcat", '<longcat_tool_call>\n{"arguments": {"a": 1,}, "name": "f"}\n</longcat_tool_call>'),
    ("gigachat3", "Done.<|message_sep|>\n\nassistant<|role_sep|>\nMore."),  # a message, not a call
    ("gigachat3", '<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "f", "arguments": "a=1"}'),
    ("apertus", '<|tools_prefix|>[{"f": [1]}]<|tools_suffix|>'),  # the arguments not an object
    ("apertus", '<|tools_prefix|>[{"name": "f", "arguments": {}}]<|tools_suffix|>'),  # Hermes' object
]
MALFORMED_LATE = [
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>'),  # trailing comma
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call_x>'),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1}'),  # cut off (max_tokens)
    ("llama3", '{"name": "f", "parameters": {"a": NaN}}'),
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {}} {"name": "g", "arguments": {}}]'),
    ("pythonic", "[f(a=1, a=2)]"),
    ("olmo3", "<function_calls>\nf(a=1) g()\n</function_calls>"),  # two calls on one line
    ("longcat", '<longcat_tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'),  # the wrong close tag
    ("gigachat3", '<|function_call|>{"name": "f", "arguments": {"a": tru}}'),
    ("apertus", '<|tools_prefix|>[{"f": {"a": 1}, "g": {}}]<|tools_suffix|>'),  # two members in one object
]
MALFORMED = MALFORMED_EARLY + MALFORMED_LATE


def stream(fmt: str, text: str, cuts: list[int], tool_names=None) -> list:
    """Without schemas: every value read as the parser reads an untyped one."""
    return stream_in(fmt, text, cuts, tool_names, schemas=None)


def chunkings(text: str, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = [list(range(1, len(text))), []]  # one character at a time; everything at once
    for _ in range(6):
        out.append(sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12)))))
    return out


@pytest.mark.parametrize("case", range(len(CASES)))
def test_parse_recorded_outputs(case):
    fmt, text, content, calls = CASES[case]
    got = get_parser(fmt).parse(text)
    assert got.content == content
    assert calls_of(got) == calls
    for c in got.calls:
        assert c.id.startswith("call_")
    assert len({c.id for c in got.calls}) == len(got.calls)


@pytest.mark.parametrize("case", [i for i, c in enumerate(CASES) if c[0] not in ("pythonic", "olmo3")])
def test_json_formats_keep_the_models_argument_text(case):
    """JSON formats pass the model's own arguments text on byte for byte (pythonic / olmo3 convert to JSON)."""
    fmt, text, _, calls = CASES[case]
    got = get_parser(fmt).parse(text)
    assert len(got.calls) == len(calls)
    for c in got.calls:
        assert c.arguments in text


@pytest.mark.parametrize("case", range(len(CASES) + len(MALFORMED_EARLY)))
def test_streamed_deltas_add_up_to_the_parse(case):
    fmt, text = CASES[case][:2] if case < len(CASES) else MALFORMED_EARLY[case - len(CASES)]
    full = get_parser(fmt).parse(text)
    for cuts in chunkings(text, case):
        events = stream(fmt, text, cuts)
        got = collect(events)
        assert got.content == full.content, cuts
        assert [(c.name, c.arguments) for c in got.calls] == [(c.name, c.arguments) for c in full.calls], cuts
        starts = [e for e in events if isinstance(e, CallStart)]
        assert [e.index for e in starts] == list(range(len(full.calls)))  # each name exactly once, in order
        for e in events:  # arguments only for a call already started
            if isinstance(e, CallArgs):
                assert e.index < len(starts) and e.text


@pytest.mark.parametrize("case", range(len(MALFORMED)))
def test_malformed_calls_stay_text(case):
    fmt, text = MALFORMED[case]
    got = get_parser(fmt).parse(text)
    assert got.calls == [] and got.content == text.strip()


def test_arguments_stream_in_pieces_and_the_name_once():
    text = QWEN_PARALLEL
    events = stream("hermes", text, list(range(1, len(text))))
    first = [e for e in events if isinstance(e, CallArgs) and e.index == 0]
    assert len(first) > 10  # character by character
    assert "".join(e.text for e in first) == '{"location": "San Francisco, CA, USA"}'
    deltas = [openai_delta(e) for e in events]
    named = [d["tool_calls"][0] for d in deltas if "tool_calls" in d and "id" in d["tool_calls"][0]]
    assert [(d["index"], d["type"], d["function"]["name"], d["function"]["arguments"]) for d in named] == [
        (0, "function", "get_current_temperature", ""), (1, "function", "get_temperature_date", "")]
    pieces = [d["tool_calls"][0] for d in deltas if "tool_calls" in d and "id" not in d["tool_calls"][0]]
    assert all(set(p) == {"index", "function"} and set(p["function"]) == {"arguments"} for p in pieces)
    assert not [d for d in deltas if "content" in d]  # the newlines between blocks are not content


def test_a_partial_trigger_is_held_back_until_decided():
    p = PARSERS["hermes"]()
    assert p.feed("Hello <tool") == [Text("Hello")]  # " <tool" might start a call
    assert p.feed("_ca") == []
    assert p.feed("lx and more") == [Text(" <tool_calx and more")]
    assert p.finish() == []
    p = PARSERS["hermes"]()
    assert p.feed("Sure. <tool_") == [Text("Sure.")]
    out = p.feed('call>{"name": "f", "arguments": {"q": "a')
    assert out[0] == CallStart(0, out[0].id, "f") and out[1:] == [CallArgs(0, '{"q": "a')]
    assert p.feed('b"}}</tool_call>') == [CallArgs(0, 'b"}')]
    assert p.finish() == []
    p = PARSERS["llama3"]()
    assert p.feed("  <|python") == [] and p.feed("_tag|>{") == []
    assert p.feed('"name": "f", "parameters": {') == [CallStart(0, p._sent[0][0], "f"), CallArgs(0, "{")]


def test_plain_text_is_untouched_whitespace_included():
    text = "  Two lines,\n\nand trailing space \n"
    for fmt in PARSERS:
        assert get_parser(fmt).parse(text).content == text
        assert collect(stream(fmt, text, list(range(1, len(text))))).content == text


def test_unknown_function_names_stay_text():
    text = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    assert get_parser("hermes").parse(text, tool_names={"get_weather"}).calls == []
    assert collect(stream("hermes", text, list(range(1, len(text))), {"get_weather"})).calls == []
    assert calls_of(get_parser("pythonic").parse("[get_weather(city='x')]", {"get_weather"})) == [
        ("get_weather", {"city": "x"})]
    assert get_parser("pythonic").parse("[rm_rf(path='/')]", {"get_weather"}).calls == []


@pytest.mark.parametrize("case", range(len(MALFORMED_LATE)))
def test_a_call_that_breaks_after_it_was_sent_stays_sent_in_a_stream(case):
    """The documented limit: a stream cannot take back a call it sent; parse() sees the break first."""
    fmt, text = MALFORMED_LATE[case]
    assert get_parser(fmt).parse(text).calls == []
    events = stream(fmt, text, list(range(1, len(text))))  # one character at a time (a delta holding the
    starts = [e for e in events if isinstance(e, CallStart)]  # whole break would decide it before any send)
    assert [e.index for e in starts] == list(range(len(starts))) and starts[0].name == "f"


def test_json_scan_prefixes():
    value = {"name": "x", "arguments": {"s": "a\\\"\u00e9\n", "n": [-1.5e-3, 0, True, None], "o": {}}}
    text = json.dumps(value)
    for k in range(len(text)):
        assert scan_json(text[:k]).status == PARTIAL, text[:k]
    scan = scan_json(text + " tail")
    assert (scan.status, scan.end) == (COMPLETE, len(text))
    assert {m.key: json.loads(text[m.start:m.end]) for m in scan.members} == value
    for bad in ('{"a": 1,}', '{"a" 1}', "[1 2]", '{"a": tru }', '{"a": 01}', '{"a": NaN}', "{a: 1}", r'{"a": "\x"}'):
        assert scan_json(bad).status == INVALID, bad



@pytest.mark.parametrize("text", [
    json.dumps({"name": "x", "arguments": {"s": "a\\\"\u00e9 " * 5, "n": [-1.5e-3, 0, True, None], "o": {}}}),
    json.dumps({"name": "x", "arguments": {"s": "\u00e9\n"}}, ensure_ascii=True) + " tail",
    '{"a": [1, 2,, 3]}', '{"a": "\\uZZ"}',
])
def test_a_continued_scan_equals_a_fresh_one_at_every_prefix(text):
    """JsonScanner (streaming) resumes inside strings and escapes: same answers as scanning from scratch."""
    scanner = JsonScanner(0)
    for k in range(1, len(text) + 1):
        got, fresh = scanner.scan(text[:k]), scan_json(text[:k])
        assert (got.status, got.start, got.end) == (fresh.status, fresh.start, fresh.end), text[:k]
        assert [(m.key, m.start, m.end) for m in got.members] == [(m.key, m.start, m.end) for m in fresh.members]


def test_registry_and_template_detection():
    assert get_parser("qwen25") is get_parser("hermes")
    with pytest.raises(ValueError, match="unknown tool-call parser 'nope'"):
        get_parser("nope")
    assert detect_parser("{% if tools %}<tool_call>{{ t }}</tool_call>{% endif %}") == "hermes"
    assert detect_parser("{{- '<|python_tag|>' }}") == "llama3"
    assert detect_parser("[TOOL_CALLS]") == "mistral"
    assert detect_parser("<|im_start|>{{ m.content }}") is None
    assert detect_parser(None) is None


def test_the_flag_offers_every_parser_and_each_alias_is_its_formats_class():
    from radixlang_runtime.server_flags_help import CHOICES

    assert set(CHOICES["tool_call_parser"]) == set(PARSERS)
    for alias, name in ALIASES.items():
        assert get_parser(alias) is get_parser(name)
        assert alias != name


# ------------------------------------------------------------------------------------ properties
from hypothesis import given, settings, strategies as st  # noqa: E402

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=8))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=4), inner, max_size=3), max_leaves=6)
_calls = st.lists(st.tuples(st.sampled_from(["get_weather", "f", "lookup_2"]),
                            st.dictionaries(st.from_regex(r"[a-z_]{1,6}", fullmatch=True), _values, max_size=3)),
                  min_size=1, max_size=3)


XML_ARGS = {"qwen3_coder", "seed_oss", "glm45", "glm47", "minimax-m2", "minimax_m2", "step3", "minimax-m3",
            "minimax_m3", "kimi_k3", "dots", "minicpm5"}  # test_tool_formats.py


def _render(fmt: str, calls: list, style: int) -> str:
    objs = [{"name": n, ("parameters" if fmt == "llama3" else "arguments"): a} for n, a in calls]

    def dump(o: dict) -> str:
        return json.dumps(o, ensure_ascii=bool(style % 2))

    if fmt == "hermes":
        if style % 3 == 0:  # SmolLM2's list form
            return "<tool_call>[\n" + ",\n".join(map(dump, objs)) + "\n]</tool_call>"
        return "\n".join(f"<tool_call>\n{dump(o)}\n</tool_call>" for o in objs)
    if fmt == "llama3":
        return ("<|python_tag|>" if style % 2 else "") + "; ".join(map(dump, objs))
    if fmt == "mistral":
        return "[TOOL_CALLS] [" + ", ".join(map(dump, objs)) + "]"
    if fmt == "olmo3":  # a call a line; JSON's true / false / null for such values half the time
        def olmo(v):
            return json.dumps(v) if style % 2 and (v is None or isinstance(v, bool)) else repr(v)

        return "<function_calls>\n" + "\n".join(f"{n}(" + ", ".join(f"{k}={olmo(v)}" for k, v in a.items()) + ")"
                                                 for n, a in calls) + "\n</function_calls>"
    if fmt == "xlam":  # the bare list, or in a fence, a block or after [TOOL_CALLS]
        body = "[" + ", ".join(map(dump, objs)) + "]"
        return ("{}", "```json\n{}\n```", "<tool_call>{}</tool_call>", "[TOOL_CALLS]{}")[style % 4].format(body)
    if fmt == "cohere_command4":  # as its template writes the calls: numbered, "tool_name"
        return "<|START_ACTION|>[" + ", ".join(dump({"tool_call_id": str(i), "tool_name": n, "parameters": a})
                                                for i, (n, a) in enumerate(calls)) + "]<|END_ACTION|>"
    if fmt == "jamba":
        return "<tool_calls>[" + ", ".join(map(dump, objs)) + "]</tool_calls>"
    if fmt == "apertus":  # {NAME: arguments} objects in a list
        return "<|tools_prefix|>[" + ", ".join(dump({n: a}) for n, a in calls) + "]<|tools_suffix|>"
    if fmt == "longcat":  # blocks back to back, or on their own lines
        return ("" if style % 2 else "\n").join(f"<longcat_tool_call>\n{dump(o)}\n</longcat_tool_call>" for o in objs)
    if fmt == "gigachat3":  # a call message each (3.0's separator and role, or 3.1's token), `</s>` or not after it
        head = ("<|message_sep|>\n\nfunction call<|role_sep|>\n", "<|function_call|>")[style % 2]
        return "".join(head + dump(o) + ("</s>" if style % 3 == 0 else "") for o in objs)
    if fmt == "internlm":  # with or without a space between the tokens (vLLM / SGLang)
        plugin = "<|action_start|>" + " " * (style % 2) + "<|plugin|>\n"
        return "".join(plugin + dump(o) + "<|action_end|>" for o in objs)
    if fmt == "phi4_mini_json":
        return "functools[" + ", ".join(map(dump, objs)) + "]"
    if fmt == "granite":  # the token, the string, or nothing before the list
        return ("<|tool_call|>", "<tool_call>", "")[style % 3] + "[" + ", ".join(map(dump, objs)) + "]"
    if fmt in ("deepseekv3", "deepseekv31", "deepseekv32", "deepseek_v32", "deepseekv4", "deepseek_v4", "kimi_k2",
               "gpt-oss"):  # each model's layout
        syn = get_parser(fmt).syntax
        return syn.open + syn.sep.join(syn.call_open + n + (syn.index + str(i) if syn.index else "") + syn.name_close
                                       + dump(a) + syn.call_close for i, (n, a) in enumerate(calls)) + syn.close
    if fmt in ("gemma4", "functiongemma"):  # bare keys where they read as one, strings between quote tokens
        parser = get_parser(fmt)

        def g4(v):
            if isinstance(v, str):
                return parser.quote + v + parser.quote
            if isinstance(v, list):
                return "[" + ",".join(map(g4, v)) + "]"
            if isinstance(v, dict):
                return "{" + ",".join((k if re.fullmatch(r"\w+", k) else g4(k)) + ":" + g4(x) for k, x in v.items()) \
                    + "}"
            return json.dumps(v)

        sep = " " if style % 2 else ""
        return sep.join(f"{parser.start}call:{n}" + g4(a) + parser.end for n, a in calls)
    python = "[" + ", ".join(f"{n}(" + ", ".join(f"{k}={v!r}" for k, v in a.items()) + ")" for n, a in calls) + "]"
    if fmt == "lfm2":  # the Python list, or the JSON one, in its special tokens
        return "<|tool_call_start|>" + ("[" + ", ".join(map(dump, objs)) + "]" if style % 2 else python) \
            + "<|tool_call_end|>"
    return python


@settings(max_examples=150, deadline=None)
@given(fmt=st.sampled_from(sorted(set(PARSERS) - set(ALIASES) - {"qwen25", "qwen", *XML_ARGS})), calls=_calls,
       style=st.integers(0, 5), lead=st.sampled_from(["", "Sure, calling now.\n"]), data=st.data())
def test_any_rendered_calls_parse_back_and_stream_the_same(fmt, calls, style, lead, data):
    if fmt in ("llama3", "pythonic", "granite") or (fmt == "xlam" and style % 4 == 0):
        lead = ""  # these formats take calls only at the output's start
    text = lead + _render(fmt, calls, style)
    got = get_parser(fmt).parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in got.calls] == [(n, a) for n, a in calls]
    assert got.content == lead.strip()
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=20)))
    streamed = collect(stream(fmt, text, cuts))
    assert streamed.content == got.content
    assert [(c.name, c.arguments) for c in streamed.calls] == [(c.name, c.arguments) for c in got.calls]


@settings(max_examples=200, deadline=None)
@given(fmt=st.sampled_from(sorted(PARSERS)), data=st.data(),
       pieces=st.lists(st.sampled_from(["<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "{", "}",
                                        "[", "]", '"name"', ": ", '"f"', ", ", '"arguments"', "(", ")", "=", "a",
                                        " ", "\n", "'", '"', ";", "x"]), max_size=30))
def test_any_text_streams_without_error_and_keeps_what_it_does_not_call(fmt, pieces, data):
    """Hostile fragments in any chunking: no exception; a stream with no call gives back the text whole."""
    text = "".join(pieces)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=10))) if text else []
    events = stream(fmt, text, cuts)
    got = collect(events)
    if not got.calls:
        assert got.content == text
    full = get_parser(fmt).parse(text)
    if not full.calls:
        assert full.content == text


# ------------------------------------------------------------------------------------ forced calls
WEATHER = {"type": "function", "function": {"name": "get-weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
NOARGS = {"type": "function", "function": {"name": "now"}}


def _forced(choice, parallel=True, parser="hermes"):
    from radixlang_runtime.server.openai_tools import check_tools, with_parser

    plan = check_tools({"tools": [WEATHER, NOARGS], "tool_choice": choice, "parallel_tool_calls": parallel})
    plan = with_parser(plan, parser, None)
    return plan


@pytest.mark.parametrize("list_form", [True, False])
def test_forced_call_regex_matches_exactly_what_the_parser_reads(list_form):
    import re

    from radixlang_runtime.server.openai_tools import forced_call_regex

    one = '{"name": "get-weather", "arguments": {"city": "Paris", "days": 3}}'
    two = '{"name": "now", "arguments": {}}'
    if list_form:
        texts = [f"<tool_call>[\n{one}\n]</tool_call>", f"<tool_call>[\n{one},\n{two}\n]</tool_call>"]
    else:
        block = "<tool_call>\n{}\n</tool_call>"
        texts = [block.format(one), block.format(one) + "\n" + block.format(two)]
    many = re.compile(forced_call_regex(_forced("required"), list_form))
    single = re.compile(forced_call_regex(_forced("required", parallel=False), list_form))
    named = re.compile(forced_call_regex(_forced({"type": "function", "function": {"name": "now"}}), list_form))
    assert many.fullmatch(texts[0]) and many.fullmatch(texts[1])
    assert single.fullmatch(texts[0]) and not single.fullmatch(texts[1])  # parallel_tool_calls false: one call
    assert not named.fullmatch(texts[0])  # a named function: only that one
    assert not many.fullmatch(texts[0].replace('"Paris"', "3"))  # the schema: city is a string
    for t in texts:
        assert [c.name for c in get_parser("hermes").parse(t).calls] == ["get-weather", "now"][:t.count('"name"')]
