"""Gemma 4's argument values as vLLM's and SGLang's gemma4 parsers read them: `<|"|>` strings as written, bare
keys (or keys between `<|"|>`), nested objects and arrays, bare true / false / null-likes / JSON numbers, other
bare text as text; a key written twice is not a call; forced tool_choice is refused (no CallSyntax). FunctionGemma
writes the same values with `<escape>` for `<|"|>`: each reading runs in both."""

from __future__ import annotations

import json

import pytest

from radixlang_runtime.tool_parsers import CallStart, collect, get_parser

Q = '<|"|>'
TOKENS = {"gemma4": ("<|tool_call>", "<tool_call|>", Q), "functiongemma": ("<start_function_call>",
                                                                         "<end_function_call>", "<escape>")}


def call(body: str, fmt: str = "gemma4") -> str:
    start, end, quote = TOKENS[fmt]
    return start + "call:f{" + body.replace(Q, quote) + "}" + end


@pytest.mark.parametrize("raw, value", [
    ("true", True), ("false", False), ("null", None), ("None", None), ("NIL", None), ("42", 42), ("-1.5e2", -150.0),
    ("1e400", "1e400"), ("007", "007"), ("Paris", "Paris"), ("True", "True"), (f"{Q} a, {{b}} {Q}", " a, {b} "),
    (f"[{Q}x{Q}, None, {{n:1}}]", ["x", None, {"n": 1}]), (f"{{{Q}a b{Q}:[]}}", {"a b": []}), ("{}", {}),
])
@pytest.mark.parametrize("fmt", sorted(TOKENS))
def test_a_value_reads_as_the_peers_read_it(raw, value, fmt):
    text = call("v:" + raw, fmt)
    whole = get_parser(fmt).parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == [("f", {"v": value})]
    p = get_parser(fmt)()
    streamed = collect([e for ch in text for e in p.feed(ch)] + p.finish())
    assert [(c.name, c.arguments) for c in streamed.calls] == [(c.name, c.arguments) for c in whole.calls]


@pytest.mark.parametrize("body", ["v:", "v:[1,", f"v:{Q}x", "v:{a:1", "v:1,", ":1", "v:1 2]"])
@pytest.mark.parametrize("fmt", sorted(TOKENS))
def test_broken_values_stay_text(body, fmt):
    got = get_parser(fmt).parse(call(body, fmt))
    assert got.calls == [] and got.content == call(body, fmt)


def test_a_key_written_twice_stays_text():
    """A stream has sent the call at its first key (the documented limit); parse() leaves the whole call as text."""
    text = call(f"city:{Q}Oslo{Q},city:{Q}Paris{Q}")
    got = get_parser("gemma4").parse(text)
    assert got.calls == [] and got.content == text
    p = get_parser("gemma4")()
    events = [e for ch in text for e in p.feed(ch)] + p.finish()
    assert [e.name for e in events if isinstance(e, CallStart)] == ["f"]


@pytest.mark.parametrize("fmt", ["minimax-m3", "gemma4", "kimi_k3", "functiongemma", "minicpm5"])
def test_a_format_with_no_call_syntax_refuses_a_forced_tool_choice(fmt):
    from radixlang_runtime.protocol.limits import FieldError
    from radixlang_runtime.server.openai_tools import check_tools, forced_call_regex, with_parser

    plan = with_parser(check_tools({"tools": [{"type": "function", "function": {"name": "f"}}],
                                    "tool_choice": {"type": "function", "function": {"name": "f"}}}), fmt, None)
    with pytest.raises(FieldError, match=f"not supported with the {fmt} tool-call format"):
        forced_call_regex(plan, False)
