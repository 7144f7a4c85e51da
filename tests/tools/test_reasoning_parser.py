"""Reasoning parsers (deepseek-r1, qwen3, gpt-oss) on recorded-style outputs: the whole-text split, and streams in
any chunking adding up to it; the content-side stop strings; reasoning token counts. No server."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from radixlang_runtime.reasoning_parser import Split, get_reasoning_parser
from reasoning_utils import stream
from radixlang_runtime.server.openai_reasoning import ReasoningPlan, reasoning_plan, reasoning_tokens, split_whole

CASES = [  # (parser, output, reasoning, content)
    ("deepseek-r1", "Let me add 1 and 3.\nThat is 4.\n</think>\n\nThe answer is 4.", "Let me add 1 and 3.\nThat is 4.",
     "The answer is 4."),
    ("deepseek-r1", "<think>\nHmm, 2 + 2.\n</think>\n\n4", "Hmm, 2 + 2.", "4"),  # R1-0528 writes the tag itself
    ("deepseek-r1", "Still thinking about it and", "Still thinking about it and", ""),  # cut off inside
    ("deepseek-r1", "</think>Direct.", "", "Direct."),
    ("qwen3", "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?", "The user greets me.",
     "Hello! How can I help?"),
    ("qwen3", "<think>\n\n</think>\n\nNo thinking here.", "", "No thinking here."),  # enable_thinking=False
    ("qwen3", "Plain answer with </think> inside.", "", "Plain answer with </think> inside."),
    ("qwen3", "  <think>a < b</think>ok <think>x</think>", "a < b", "ok <think>x</think>"),
    ("qwen3", "<think>cut off", "cut off", ""),
    ("qwen3", "<thi", "", "<thi"),  # a partial tag at the very end is text
    ("qwen3", "<think>\nI should call the tool: <tool_call>[{\"name\": \"f\"}]</tool_call>\n</think>\n\n<tool_call>",
     "I should call the tool: <tool_call>[{\"name\": \"f\"}]</tool_call>", "<tool_call>"),
]
# gpt-oss (harmony): the output after the template's `<|start|>assistant`; its EOS tokens (<|return|>, <|call|>) are
# stop tokens, usually not in the text
H_CALL = ("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
          "{\"city\":\"Tokyo\"}<|call|>")
CASES += [
    ("gpt-oss", "<|channel|>analysis<|message|>User greets. Reply.<|end|><|start|>assistant<|channel|>final"
                "<|message|>Hello! How can I help?", "User greets. Reply.", "Hello! How can I help?"),
    ("gpt-oss", "<|channel|>analysis<|message|>2 + 2 = 4.\n<|end|><|start|>assistant<|channel|>final<|message|>"
                "**4**<|return|>", "2 + 2 = 4.\n", "**4**"),
    ("gpt-oss", "<|channel|>analysis<|message|>Need weather in Tokyo.<|end|>" + H_CALL, "Need weather in Tokyo.",
     H_CALL),
    ("gpt-oss", "<|channel|>analysis<|message|>Need the time.<|end|><|start|>assistant to=functions.now"
                "<|channel|>commentary json<|message|>{}", "Need the time.",
     "<|start|>assistant to=functions.now<|channel|>commentary json<|message|>{}"),
    ("gpt-oss", "<|channel|>analysis<|message|>Thinking about it", "Thinking about it", ""),  # cut off inside
    ("gpt-oss", "<|channel|>final<|message|>Just this.", "", "Just this."),
    ("gpt-oss", "<|channel|>analysis<|message|>a < b and <|x<|end|><|start|>assistant<|channel|>final<|message|>ok",
     "a < b and <|x", "ok"),
    ("gpt-oss", "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
     "", "Checking.Done."),  # a preamble without a recipient is content
    ("gpt-oss", "No harmony here <|", "", "No harmony here <|"),
    ("gpt-oss", "<|chan", "", "<|chan"),  # a partial marker at the very end is text
]


@pytest.mark.parametrize("name,text,reasoning,content", CASES)
def test_whole_split(name, text, reasoning, content):
    assert get_reasoning_parser(name).parse(text) == Split(reasoning, content)


@pytest.mark.parametrize("name,text,reasoning,content", CASES)
def test_streams_character_by_character_and_in_two_pieces(name, text, reasoning, content):
    assert stream(name, list(text)) == Split(reasoning, content)
    for cut in range(len(text) + 1):
        assert stream(name, [text[:cut], text[cut:]]) == Split(reasoning, content), cut


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["deepseek-r1", "qwen3"]),
       st.lists(st.sampled_from(["<think>", "</think>", "<", "</th", "ink>", " ", "\n", "a", "b c", "<tool_call>"]),
                max_size=12),
       st.data())
def test_streamed_equals_whole_in_any_chunking(name, parts, data):
    text = "".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert stream(name, pieces) == get_reasoning_parser(name).parse(text)


def test_reasoning_is_sent_before_its_end_arrives():
    p = get_reasoning_parser("deepseek-r1")()
    assert p.feed("First I think ") == Split("First I think", "")  # trailing space held: it may precede </think>
    assert p.feed("more </th") == Split(" more", "")  # the partial end tag held
    assert p.feed("ink>\n\nAnswer") == Split("", "Answer")


def test_stop_strings_cut_only_the_content():
    plan = ReasoningPlan(get_reasoning_parser("qwen3"), stops=["STOP", "."])
    split, cut = split_whole(plan, "<think>a. STOP b.</think>The end. More STOP")
    assert (split, cut) == (Split("a. STOP b.", "The end"), True)
    split, cut = split_whole(plan, "<think>a. b.</think>No stop here")
    assert (split, cut) == (Split("a. b.", "No stop here"), False)
    # streamed: a stop split over deltas is still found, and nothing after it goes out
    rs = plan.stream()
    out = Split()
    for piece in ["<think>x.</think>ab", "cS", "TO", "P and more", " text"]:
        out += rs.feed(piece, final=False)
    assert (out, rs.stopped) == (Split("x.", "abc"), True)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<|channel|>", "analysis", "final", "<|message|>", "<|end|>", "<|start|>",
                                 "assistant", " to=functions.f", "<|call|>", "<|", "<", "a", " b\n"]), max_size=14),
       st.data())
def test_harmony_streamed_equals_whole_in_any_chunking(parts, data):
    text = "".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert stream("gpt-oss", pieces) == get_reasoning_parser("gpt-oss").parse(text)


def test_harmony_reasoning_tokens_end_with_the_analysis_message():
    vocab = ["<|channel|>", "analysis", "<|message|>", "Hmm", "<|end|>", "<|start|>", "assistant", "final", "Hi"]

    def decode(ids):
        return "".join(vocab[i] for i in ids)

    plan = ReasoningPlan(get_reasoning_parser("gpt-oss"))
    assert reasoning_tokens(plan, [0, 1, 2, 3, 4, 5, 6, 0, 7, 2, 8], decode) == 5
    assert reasoning_tokens(plan, [0, 7, 2, 8], decode) == 0  # no analysis message
    assert reasoning_tokens(plan, [0, 1, 2, 3, 3], decode) == 5  # cut off while thinking


def test_reasoning_tokens_counts_up_to_the_end_tag():
    vocab = ["<think>", "I", " think", "</think>", "\n\n", "Hi", "!"]

    def decode(ids):
        return "".join(vocab[i] for i in ids)

    qwen = ReasoningPlan(get_reasoning_parser("qwen3"))
    assert reasoning_tokens(qwen, [0, 1, 2, 3, 4, 5, 6], decode) == 4
    assert reasoning_tokens(qwen, [5, 6], decode) == 0
    assert reasoning_tokens(qwen, [0, 1, 2], decode) == 3  # cut off while thinking
    r1 = ReasoningPlan(get_reasoning_parser("deepseek-r1"))
    assert reasoning_tokens(r1, [1, 2, 3, 5], decode) == 3
    assert reasoning_tokens(r1, [1, 2], decode) == 2


def test_request_fields_and_unknown_names():
    assert reasoning_plan(None, {}) is None
    assert reasoning_plan("qwen3", {"separate_reasoning": False}) is None
    plan = reasoning_plan("qwen3", {"stream_reasoning": False})
    assert plan.parser.name == "qwen3" and not plan.stream_reasoning
    with pytest.raises(ValueError, match="separate_reasoning"):
        reasoning_plan("qwen3", {"separate_reasoning": "yes"})
    with pytest.raises(ValueError, match="unknown reasoning parser 'nope'"):
        get_reasoning_parser("nope")
    from radixlang_runtime.server_args import ServerArgs

    with pytest.raises(ValueError, match="reasoning_parser 'nope'"):
        ServerArgs(reasoning_parser="nope")
    assert ServerArgs(reasoning_parser="deepseek-r1").reasoning_parser == "deepseek-r1"


def test_the_regex_before_a_forced_call_allows_the_format_s_reasoning_block():
    import re

    r1 = re.compile(ReasoningPlan(get_reasoning_parser("deepseek-r1")).regex_prefix() + "CALL")
    assert r1.fullmatch("I will call it.\n</think>\n\nCALL") and r1.fullmatch("<think>x</think>CALL")
    assert not r1.fullmatch("CALL") and not r1.fullmatch("a <b> </think>CALL")  # r1 is inside: it must close
    q3 = re.compile(ReasoningPlan(get_reasoning_parser("qwen3")).regex_prefix() + "CALL")
    assert q3.fullmatch("CALL") and q3.fullmatch("<think>\nhm\n</think>\n\nCALL") and not q3.fullmatch("x</think>CALL")
