"""--reasoning-parser: the formats by name, SGLang's names with vLLM's as aliases (no torch).

Each format but gpt-oss is a start / end marker pair run by the streaming machine in reasoning_machine.py (where
an output begins: inside, may_open or outside the block; the class gives the default, a request's prompt may
decide otherwise). The formats:
  deepseek-r1     `<think>` / `</think>`, inside: the chat template opens `<think>`; a `<think>` the model writes
                  itself at the start is skipped (R1-0528 writes it); no `</think>` at all: all reasoning.
  qwen3           `<think>` / `</think>`, may_open: an output that does not open with the block is all content.
  deepseek-v3     as qwen3: DeepSeek V3.1 / V3.2's template ends the prompt with `<think>` in thinking mode and
                  `</think>` otherwise (the prompt decides).
  qwen3-thinking  as deepseek-r1 (Qwen3-2507 Thinking's template opens `<think>`).
  glm45           as qwen3; the reasoning also ends where the model opens `<tool_call>` before `</think>`.
  kimi            `◁think▷` / `◁/think▷`, may_open (Kimi-VL Thinking).
  kimi_k2         as qwen3; the reasoning also ends at `<|tool_calls_section_begin|>` (Kimi K2 Thinking).
  minimax         as deepseek-r1 (MiniMax M2 writes its reasoning before `</think>`).
  step3, step3p5  as deepseek-r1.
  mistral         `[THINK]` / `[/THINK]`, may_open (Magistral); the markers are special tokens, kept.
  seed_oss        `<seed:think>` / `</seed:think>`, inside (vLLM's name; SGLang has none).
  gpt-oss         OpenAI's harmony messages (reasoning_harmony.HarmonyParser): the analysis channel.
  interns1, mimo, poolside_v1: qwen3's format under SGLang's names for those models.
"""

from __future__ import annotations

from radixlang_runtime.reasoning_harmony import HarmonyParser
from radixlang_runtime.reasoning_machine import INSIDE, MAY_OPEN, OUTSIDE, ReasoningParser, Split

__all__ = ["INSIDE", "MAY_OPEN", "OUTSIDE", "REASONING_PARSERS", "HarmonyParser", "ReasoningParser", "Split",
           "get_reasoning_parser"]


class DeepSeekR1Parser(ReasoningParser):
    name = "deepseek-r1"
    starts_inside = True


class Qwen3Parser(ReasoningParser):
    name = "qwen3"


class DeepSeekV3Parser(ReasoningParser):
    name = "deepseek-v3"


class Qwen3ThinkingParser(ReasoningParser):
    name = "qwen3-thinking"
    starts_inside = True


class Glm45Parser(ReasoningParser):
    name = "glm45"
    tool_start = "<tool_call>"


class KimiParser(ReasoningParser):
    name = "kimi"
    start, end = "◁think▷", "◁/think▷"


class KimiK2Parser(ReasoningParser):
    name = "kimi_k2"
    tool_start = "<|tool_calls_section_begin|>"


class MiniMaxParser(ReasoningParser):
    name = "minimax"
    starts_inside = True


class Step3Parser(ReasoningParser):
    name = "step3"
    starts_inside = True


class MistralParser(ReasoningParser):
    name = "mistral"
    start, end = "[THINK]", "[/THINK]"
    keeps_special_tokens = True


class SeedOssParser(ReasoningParser):
    name = "seed_oss"
    start, end = "<seed:think>", "</seed:think>"
    starts_inside = True


_CLASSES = (DeepSeekR1Parser, Qwen3Parser, DeepSeekV3Parser, Qwen3ThinkingParser, Glm45Parser, KimiParser,
            KimiK2Parser, MiniMaxParser, Step3Parser, MistralParser, SeedOssParser, HarmonyParser)
# more names of the same formats: SGLang's other names, then vLLM's (where its parser behaves the same)
ALIASES: dict[str, str] = {
    "step3p5": "step3", "interns1": "qwen3", "mimo": "qwen3", "poolside_v1": "qwen3",
    "deepseek_r1": "deepseek-r1", "deepseek_v3": "deepseek-v3", "minimax_m2": "minimax",
    "openai_gptoss": "gpt-oss",
}
REASONING_PARSERS: dict[str, type[ReasoningParser]] = {p.name: p for p in _CLASSES}
REASONING_PARSERS.update({alias: REASONING_PARSERS[name] for alias, name in ALIASES.items()})


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; known: {', '.join(sorted(REASONING_PARSERS))}") \
            from None
