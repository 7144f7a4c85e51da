"""gpt-oss's harmony outputs as OpenAI's own harmony library (openai-harmony) renders and parses them: the
reasoning parser (`gpt-oss`) then the tool parser (`gpt-oss`) on its content must give the reasoning, the content
and the function calls of openai-harmony's parsed messages (analysis: reasoning; a `functions.*` recipient: a call
with the body as its arguments; final / commentary without a recipient, and text outside any message: content),
whole and streamed in any chunking.

The recorded outputs are openai-harmony's own (its repository's test-data/ renderings, the texts its tests parse
and the examples of its docs/format.md; Apache-2.0), with the messages its tests assert its parser returns (for
the docs' examples: the messages the format defines). Where
openai-harmony can load its o200k_harmony vocabulary (it downloads it on first use; TIKTOKEN_ENCODINGS_BASE names a
local copy, which scripts/harmony_vocab.sh writes), the same completions are also rendered from messages by its
renderer and parsed back by its StreamableParser, token by token, here."""

from __future__ import annotations

import functools

import json
from dataclasses import dataclass
from typing import Optional

import pytest

from radixlang_runtime.reasoning_parser import Split, get_reasoning_parser
from radixlang_runtime.tool_parsers import collect, get_parser


@dataclass(frozen=True)
class Msg:
    """One message as openai-harmony's parser returns it (author role assistant)."""

    content: str
    channel: Optional[str] = None
    recipient: Optional[str] = None
    content_type: Optional[str] = None


# (completion: the model's output after the prompt's `<|start|>assistant`, openai-harmony's parsed messages)
RECORDED = {
    # test-data/test_simple_reasoning_response.txt (tokens: analysis ended by <|return|>, final cut off)
    "reasoning_then_final": (
        '<|channel|>analysis<|message|>User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.<|return|>'
        "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.",
        [Msg('User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.', "analysis"),
         Msg("2 + 2 = 4.", "final")]),
    # test-data/test_does_not_drop_if_ongoing_analysis.txt (rendered by openai-harmony: the recipient in the role
    # header, `commentary <|constrain|>json`)
    "analysis_then_call": (
        "<|channel|>analysis<|message|>User asks: \u201cWhat is the weather in SF?\u201d We need to use "
        "lookup_weather tool.<|end|><|start|>assistant to=functions.lookup_weather<|channel|>commentary "
        '<|constrain|>json<|message|>{"location": "San Francisco"}<|call|>',
        [Msg("User asks: \u201cWhat is the weather in SF?\u201d We need to use lookup_weather tool.", "analysis"),
         Msg('{"location": "San Francisco"}', "commentary", "functions.lookup_weather", "<|constrain|>json")]),
    # openai-harmony renders a call with its recipient in the role header: as the output's first message (the prompt
    # ends with that header's `<|start|>assistant`) the completion begins with the header's rest
    "recipient_in_first_role_header": (
        ' to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"location": "Tokyo"}<|call|>',
        [Msg('{"location": "Tokyo"}', "commentary", "functions.get_weather", "<|constrain|>json")]),
    # test_tool_call_with_constrain_marker_adjacent: no space before <|constrain|>
    "constrain_adjacent": (
        '<|start|>assistant to=functions.get_weather<|channel|>commentary<|constrain|>json<|message|>'
        '{"location": "Tokyo"}<|call|>',
        [Msg('{"location": "Tokyo"}', "commentary", "functions.get_weather", "<|constrain|>json")]),
    # test_tool_call_with_channel_before_recipient_and_constrain_adjacent: the recipient in the channel header
    "recipient_after_channel": (
        "<|start|>assistant<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>"
        '{"latitude":48.8566,"longitude":2.3522}<|call|>',
        [Msg('{"latitude":48.8566,"longitude":2.3522}', "commentary", "functions.get_weather", "<|constrain|>json")]),
    # test_streamable_parser_missing_message_token (strict=False): text before any header is a message of its own
    "text_before_messages": (
        "I must refuse<|end|><|start|>assistant<|channel|>analysis<|message|>We must refuse<|end|>"
        "<|start|>assistant<|channel|>final<|message|>I'm sorry, but I can't help with that.<|return|>",
        [Msg("I must refuse"), Msg("We must refuse", "analysis"),
         Msg("I'm sorry, but I can't help with that.", "final")]),
    # test-data/test_keep_analysis_between_finals.txt's second answer: analysis, then final ended by <|end|>
    "analysis_between_finals": (
        "<|channel|>analysis<|message|>thinking 3+5<|end|><|start|>assistant<|channel|>final<|message|>8<|end|>",
        [Msg("thinking 3+5", "analysis"), Msg("8", "final")]),
    # openai-harmony's docs/format.md, function calling: the recipient after the channel, a space before
    # <|constrain|>
    "format_doc_call": (
        "<|channel|>analysis<|message|>Need to use function get_weather.<|end|><|start|>assistant<|channel|>"
        'commentary to=functions.get_weather <|constrain|>json<|message|>{"location":"San Francisco"}<|call|>',
        [Msg("Need to use function get_weather.", "analysis"),
         Msg('{"location":"San Francisco"}', "commentary", "functions.get_weather", "<|constrain|>json")]),
    # docs/format.md, preambles: a commentary message for the user before the call
    "format_doc_preamble": (
        "<|channel|>analysis<|message|>{long chain of thought}<|end|><|start|>assistant<|channel|>commentary"
        "<|message|>**Action plan**:\n1. Generate an HTML file\n2. Generate a JavaScript for the Node.js server\n"
        "3. Start the server\n---\nWill start executing the plan step by step<|end|><|start|>assistant<|channel|>"
        'commentary to=functions.generate_file<|constrain|>json<|message|>{"template": "basic_html", '
        '"path": "index.html"}<|call|>',
        [Msg("{long chain of thought}", "analysis"),
         Msg("**Action plan**:\n1. Generate an HTML file\n2. Generate a JavaScript for the Node.js server\n"
             "3. Start the server\n---\nWill start executing the plan step by step", "commentary"),
         Msg('{"template": "basic_html", "path": "index.html"}', "commentary", "functions.generate_file",
             "<|constrain|>json")]),
}
TOOLS = {"lookup_weather", "get_weather", "generate_file"}


def expected_of(messages: list[Msg]) -> tuple[str, str, list[tuple[str, dict]]]:
    """openai-harmony's messages as a chat completion: (reasoning, content, [(function, arguments)])."""
    reasoning = "".join(m.content for m in messages if m.channel == "analysis" and m.recipient is None)
    content = "".join(m.content for m in messages if m.channel != "analysis" and m.recipient is None)
    calls = [(m.recipient.removeprefix("functions."), json.loads(m.content)) for m in messages
             if m.recipient is not None and m.recipient.startswith("functions.")]
    return reasoning, content, calls


def ours_whole(text: str) -> tuple[str, str, list[tuple[str, dict]]]:
    split = get_reasoning_parser("gpt-oss").parse(text)
    parsed = get_parser("gpt-oss").parse(split.content, TOOLS)
    return split.reasoning, parsed.content, [(c.name, json.loads(c.arguments)) for c in parsed.calls]


def ours_streamed(pieces: list[str]) -> tuple[str, str, list[tuple[str, dict]]]:
    """As the chat route runs them: each delta through the reasoning parser, its content through the tool parser."""
    think, tools = get_reasoning_parser("gpt-oss")(), get_parser("gpt-oss")(TOOLS)
    split, events = Split(), []
    for piece in pieces:
        part = think.feed(piece)
        split += part
        events += tools.feed(part.content)
    last = think.finish()
    split += last
    events += tools.feed(last.content) + tools.finish()
    parsed = collect(events)
    return split.reasoning, parsed.content, [(c.name, json.loads(c.arguments)) for c in parsed.calls]


MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|return|>", "<|call|>")


def token_pieces(text: str) -> list[str]:
    """The completion in the pieces a detokenizer sends: each special token alone, the text between in words."""
    out, i = [], 0
    while i < len(text):
        mark = next((m for m in MARKERS if text.startswith(m, i)), None)
        if mark:
            out.append(mark)
            i += len(mark)
            continue
        j = i + 1
        while j < len(text) and not text.startswith(MARKERS, j) and text[j] != " ":
            j += 1
        out.append(text[i:j])
        i = j
    return out


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_completions_split_as_openai_harmony_parses_them(name):
    text, messages = RECORDED[name]
    want = expected_of(messages)
    assert ours_whole(text) == want
    assert ours_streamed(token_pieces(text)) == want
    assert ours_streamed(list(text)) == want  # a character at a time
    for k in range(1, len(text)):  # every split in two
        assert ours_streamed([text[:k], text[k:]]) == want, k


def test_expected_messages_cover_every_part():
    """The recorded set holds reasoning, content and calls (a mapping slip cannot pass on empty fields)."""
    parts = [expected_of(m) for _, m in RECORDED.values()]
    assert sum(bool(r) for r, _, _ in parts) >= 5 and sum(bool(c) for _, c, _ in parts) >= 3
    assert sum(len(calls) for _, _, calls in parts) == 6


@functools.cache
def _load_encoding():
    """(the module, its encoding) or (None, why): one load attempt per test run (it may try the network)."""
    harmony = pytest.importorskip("openai_harmony")
    try:
        return harmony, harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    except harmony.HarmonyError as e:  # no network and no local o200k_harmony vocabulary
        return None, str(e)


def _harmony_encoding():
    harmony, enc = _load_encoding()
    if harmony is None:
        pytest.skip(f"openai-harmony cannot load its vocabulary here: {enc}")
    return harmony, enc


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_openai_harmony_renders_and_parses_the_same(name):
    """openai-harmony renders the messages (role assistant, recipient, content type) to o200k_harmony tokens; its
    StreamableParser reads them back to the same messages, and our parsers, fed its decoded text token by token,
    give the same split."""
    harmony, enc = _harmony_encoding()
    text, messages = RECORDED[name]
    if messages[0].channel is None:
        pytest.skip("text outside any message is not rendered by openai-harmony")
    built = []
    for m in messages:
        msg = harmony.Message.from_role_and_content(harmony.Role.ASSISTANT, m.content).with_channel(m.channel)
        if m.recipient:
            msg = msg.with_recipient(m.recipient).with_content_type(m.content_type)
        built.append(msg)
    keep_analysis = harmony.RenderConversationConfig(auto_drop_analysis=False)  # a completion keeps its analysis
    tokens = enc.render_conversation(harmony.Conversation.from_messages(built), keep_analysis)
    parser = harmony.StreamableParser(enc, None)
    for t in tokens:
        parser.process(t)
    assert parser.messages == built
    pieces = [enc.decode_utf8([t]) for t in tokens]
    assert pieces[:2] == ["<|start|>", "assistant"]  # the prompt's end; the completion follows
    assert ours_streamed(pieces[2:]) == expected_of(messages)
    assert ours_whole("".join(pieces[2:])) == expected_of(messages)
