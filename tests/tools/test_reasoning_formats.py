"""The marker-pair reasoning formats beyond deepseek-r1 / qwen3 (reasoning_parser.py) on outputs written as those
models write them, whole and streamed in every chunking; SGLang's names and vLLM's aliases; where a request's
split begins, decided from the prompt's token ids as the scheduler's watch decides it (a tokenizer whose
`<think>` is three tokens, and one whose markers are single special tokens). No server."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings, strategies as st

from radixlang_runtime.protocol.reasoning_watch import INSIDE, MAY_OPEN, OUTSIDE, ThinkingMarkers, prompt_begins
from radixlang_runtime.reasoning_parser import ALIASES, REASONING_PARSERS, HarmonyParser, Split, get_reasoning_parser
from radixlang_runtime.server.openai_reasoning import ReasoningPlan, reasoning_tokens
from reasoning_utils import stream

K2_CALL = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{}"
           "<|tool_call_end|><|tool_calls_section_end|>")
GLM_CALL = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n</tool_call>"
CASES = [  # (parser, where the prompt left it (None: the class's default), output, reasoning, content)
    # DeepSeek V3.1 / V3.2: the template ends the prompt with `<think>` (thinking) or `</think>` (not)
    ("deepseek-v3", INSIDE, "The user asks for 2 + 2. That is 4.</think>The answer is 4.",
     "The user asks for 2 + 2. That is 4.", "The answer is 4."),
    ("deepseek-v3", OUTSIDE, "Hello! How can I assist you today?", "", "Hello! How can I assist you today?"),
    ("deepseek-v3", None, "Hello! No thinking.</think> here", "", "Hello! No thinking.</think> here"),
    # Qwen3-2507 Thinking: the template opens `<think>\n`, the model writes the rest
    ("qwen3-thinking", None, "Okay, the user says hi. I should greet back.\n</think>\n\nHello! How can I help?",
     "Okay, the user says hi. I should greet back.", "Hello! How can I help?"),
    ("qwen3-thinking", None, "Okay, let me think about", "Okay, let me think about", ""),  # cut off inside
    # GLM-4.5 / 4.6: the model opens the block itself; `enable_thinking` false renders `<think></think>`
    ("glm45", None, "\n<think>The user wants the weather in Beijing. I should call get_weather.</think>\n" + GLM_CALL,
     "The user wants the weather in Beijing. I should call get_weather.", GLM_CALL),
    ("glm45", None, "<think>I need the weather." + GLM_CALL, "I need the weather.", GLM_CALL),  # no </think> first
    ("glm45", OUTSIDE, "\nHello! I am GLM.", "", "\nHello! I am GLM."),
    ("glm45", None, "Hi <think>there</think>", "", "Hi <think>there</think>"),
    # Kimi-VL Thinking
    ("kimi", None, "◁think▷The image shows a cat on a mat.◁/think▷It is a cat.", "The image shows a cat on a mat.",
     "It is a cat."),
    ("kimi", None, "A cat.", "", "A cat."),
    # Kimi K2 Thinking: the tool calls section may begin before </think>
    ("kimi_k2", None, "<think>The user wants the time. I'll call get_time.</think>" + K2_CALL,
     "The user wants the time. I'll call get_time.", K2_CALL),
    ("kimi_k2", None, "<think>Call it now.\n" + K2_CALL, "Call it now.", K2_CALL),
    ("kimi_k2", None, "<think>Easy.</think>\n\nParis.", "Easy.", "Paris."),
    # MiniMax M2: the reasoning, then </think> (a `<think>` written first is skipped)
    ("minimax", None, "The user greets me.\n</think>\n\nHello!", "The user greets me.", "Hello!"),
    ("minimax", None, "<think>\nGreeting.\n</think>\n\nHi there.", "Greeting.", "Hi there."),
    ("minimax_m2", None, "Thinking still", "Thinking still", ""),
    # Step3 / Step-3.5: as R1
    ("step3", None, "Compute 3 * 4 = 12.\n</think>\n\n12", "Compute 3 * 4 = 12.", "12"),
    ("step3p5", None, "<think>\nOk.\n</think>\nDone", "Ok.", "Done"),
    # Magistral: [THINK]...[/THINK] (special tokens, kept by the detokenizer), only when the model thinks
    ("mistral", None, "[THINK]Okay, 2 + 2 is 4. Let me double check: yes.[/THINK]The answer is **4**.",
     "Okay, 2 + 2 is 4. Let me double check: yes.", "The answer is **4**."),
    ("mistral", None, "Just an answer [with brackets].", "", "Just an answer [with brackets]."),
    ("mistral", None, "[THI", "", "[THI"),  # a partial marker at the very end is text
    ("mistral", None, "[THINK]a [b] c[/THIN", "a [b] c[/THIN", ""),  # cut off inside, a partial end
    # Seed-OSS: <seed:think>...</seed:think>, the reasoning first
    ("seed_oss", None, "<seed:think>\nGot it, the user asks for the capital of France.\n</seed:think>"
                       "The capital of France is Paris.", "Got it, the user asks for the capital of France.",
     "The capital of France is Paris."),
    ("seed_oss", None, "<seed:think>Thinking about <think> tags", "Thinking about <think> tags", ""),
    ("seed_oss", OUTSIDE, "<seed:think>x</seed:think>y", "", "<seed:think>x</seed:think>y"),
    # a prompt that left the block open makes qwen3's may-open output reasoning; one that closed it: content
    ("qwen3", INSIDE, "Hmm.\n</think>\n\nYes.", "Hmm.", "Yes."),
    ("qwen3", OUTSIDE, "<think>\nx\n</think>\n\nYes.", "", "<think>\nx\n</think>\n\nYes."),
    ("deepseek-r1", OUTSIDE, "Direct answer.</think>", "", "Direct answer.</think>"),
    ("deepseek-r1", MAY_OPEN, "Direct answer.</think>", "", "Direct answer.</think>"),
]


@pytest.mark.parametrize("name,begins,text,reasoning,content", CASES)
def test_whole_and_streamed_in_every_two_piece_and_one_char_chunking(name, begins, text, reasoning, content):
    assert get_reasoning_parser(name).parse(text, begins) == Split(reasoning, content)
    assert stream(name, list(text), begins) == Split(reasoning, content)
    for cut in range(len(text) + 1):
        assert stream(name, [text[:cut], text[cut:]], begins) == Split(reasoning, content), cut


PAIRS = sorted({cls for cls in REASONING_PARSERS.values() if not issubclass(cls, HarmonyParser)}, key=lambda c: c.name)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(PAIRS), st.sampled_from([None, INSIDE, MAY_OPEN, OUTSIDE]), st.data())
def test_streamed_equals_whole_in_any_chunking(cls, begins, data):
    marks = [cls.start, cls.end, cls.start[:3], cls.end[:4], cls.end[-3:], *([cls.tool_start] * bool(cls.tool_start))]
    parts = data.draw(st.lists(st.sampled_from([*marks, " ", "\n", "a", "b c", "<", "["]), max_size=12))
    text = "".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert stream(cls.name, pieces, begins) == cls.parse(text, begins)


def test_names_aliases_and_the_flag_s_choices():
    from radixlang_runtime.server_args import ServerArgs
    from radixlang_runtime.server_flags_help import CHOICES

    assert set(CHOICES["reasoning_parser"]) == set(REASONING_PARSERS)
    for alias, name in ALIASES.items():
        assert get_reasoning_parser(alias) is get_reasoning_parser(name)
        assert ServerArgs(reasoning_parser=alias).reasoning_parser == alias
    assert get_reasoning_parser("deepseek_r1").starts_inside
    assert get_reasoning_parser("openai_gptoss") is HarmonyParser
    with pytest.raises(ValueError, match="unknown reasoning parser 'kimi_k3'"):
        get_reasoning_parser("kimi_k3")


def test_the_forced_call_s_regex_follows_the_markers_and_where_the_output_begins():
    magistral = ReasoningPlan(get_reasoning_parser("mistral"))
    r = re.compile(magistral.regex_prefix() + "CALL")
    assert r.fullmatch("CALL") and r.fullmatch("[THINK]plan it <x>[/THINK]\n\nCALL")
    assert not r.fullmatch("[THINK]a [b] c[/THINK]CALL")  # no `[` inside the block
    inside = re.compile(ReasoningPlan(get_reasoning_parser("qwen3"), begins=INSIDE).regex_prefix() + "CALL")
    assert inside.fullmatch("hm\n</think>\n\nCALL") and not inside.fullmatch("CALL")
    assert ReasoningPlan(get_reasoning_parser("deepseek-r1"), begins=OUTSIDE).regex_prefix() == ""


def test_reasoning_tokens_follow_where_the_output_begins():
    vocab = ["<think>", "I", " think", "</think>", "\n\n", "Hi", "!"]

    def decode(ids):
        return "".join(vocab[i] for i in ids)

    qwen = get_reasoning_parser("qwen3")
    assert reasoning_tokens(ReasoningPlan(qwen, begins=INSIDE), [1, 2, 3, 5], decode) == 3
    assert reasoning_tokens(ReasoningPlan(qwen), [1, 2, 3, 5], decode) == 0
    r1 = get_reasoning_parser("deepseek-r1")
    assert reasoning_tokens(ReasoningPlan(r1, begins=OUTSIDE), [1, 2, 3, 5], decode) == 0
    assert reasoning_tokens(ReasoningPlan(r1), [1, 2, 3, 5], decode) == 3
    # a continued prefill that closed its block: the output has no reasoning tokens
    assert reasoning_tokens(ReasoningPlan(r1, prefix="a</think>"), [5, 6], decode) == 0
    assert reasoning_tokens(ReasoningPlan(r1, prefix="<think>a"), [2, 3, 5], decode) == 2


def _special_tokenizer(tmp_path):
    """The byte-level test tokenizer with `<think>` and `</think>` added as single special tokens."""
    from transformers import AutoTokenizer

    from tiny_checkpoints import byte_tokenizer

    byte_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<think>", "</think>"]})
    return tok


def _smollm_tokenizer():
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    return AutoTokenizer.from_pretrained(embedded_tokenizer_dir())


PROMPTS = [  # (what the template put after the generation prompt, where the output begins under qwen3)
    ("", MAY_OPEN),
    ("<think>\n", INSIDE),  # Qwen3-2507 Thinking, DeepSeek V3.1 thinking
    ("<think>\n\n</think>\n\n", OUTSIDE),  # Qwen3 with enable_thinking false
    ("</think>", OUTSIDE),  # DeepSeek V3.1 without thinking
    # a tool loop's earlier reasoning in the history (Qwen3 shows it after the last user turn): not this turn's
    ("<think>\nweather needed\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
     "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny, 21 C\n"
     "</tool_response><|im_end|>\n<|im_start|>assistant\n", MAY_OPEN),
]


@pytest.mark.parametrize("which", ["three-token markers", "special-token markers"])
def test_the_prompt_s_ids_decide_where_the_split_begins(which, tmp_path):
    tok = _smollm_tokenizer() if which == "three-token markers" else _special_tokenizer(tmp_path)
    markers = ThinkingMarkers.of_parser("qwen3", tok)
    assert (len(markers.start), markers.special) == ((3, False) if which == "three-token markers" else (1, True))
    plan = ReasoningPlan(get_reasoning_parser("qwen3"))
    for tail, want in PROMPTS:
        ids = tok.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" + tail, add_special_tokens=False)
        begins = prompt_begins(ids, markers)
        assert begins == want, tail
        out = ReasoningPlan(plan.parser, begins=begins).stream().feed("Let me see.\n</think>\n\nHello.", final=True)
        assert out == (Split("Let me see.", "Hello.") if want == INSIDE else
                       Split("", "Let me see.\n</think>\n\nHello.")), tail
    assert ThinkingMarkers.from_wire(markers.to_wire()) == markers
    assert ThinkingMarkers.from_wire(markers.to_wire()[:3]).special is False  # a three-field wire still reads
