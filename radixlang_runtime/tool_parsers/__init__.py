"""Tool-call parsers by format name (SGLang's --tool-call-parser names) and detection from a chat
template. No torch."""

from __future__ import annotations

from typing import Optional

from radixlang_runtime.tool_parsers.apertus import ApertusParser
from radixlang_runtime.tool_parsers.base import (CallArgs, CallStart, CallSyntax, Event, ParseResult, Text, ToolCall,
                                                 ToolParser, collect, openai_delta)
from radixlang_runtime.tool_parsers.cohere_command4 import CohereCommand4Parser
from radixlang_runtime.tool_parsers.deepseek import DeepSeekV3Parser, DeepSeekV31Parser
from radixlang_runtime.tool_parsers.deepseek_v32 import DeepSeekV32Parser, DeepSeekV4Parser
from radixlang_runtime.tool_parsers.dots import DotsParser
from radixlang_runtime.tool_parsers.functiongemma import FunctionGemmaParser
from radixlang_runtime.tool_parsers.gemma4 import Gemma4Parser
from radixlang_runtime.tool_parsers.gigachat3 import GigaChat3Parser
from radixlang_runtime.tool_parsers.glm45 import Glm45Parser, Glm47Parser
from radixlang_runtime.tool_parsers.gpt_oss import GptOssParser
from radixlang_runtime.tool_parsers.granite import GraniteParser
from radixlang_runtime.tool_parsers.hermes import HermesParser
from radixlang_runtime.tool_parsers.internlm import InternlmParser
from radixlang_runtime.tool_parsers.jamba import JambaParser
from radixlang_runtime.tool_parsers.kimi_k2 import KimiK2Parser
from radixlang_runtime.tool_parsers.kimi_k3 import KimiK3Parser
from radixlang_runtime.tool_parsers.lfm2 import Lfm2Parser
from radixlang_runtime.tool_parsers.llama3 import Llama3JsonParser
from radixlang_runtime.tool_parsers.longcat import LongcatParser
from radixlang_runtime.tool_parsers.minicpm5 import MiniCpm5Parser
from radixlang_runtime.tool_parsers.minimax_m2 import MiniMaxM2Parser
from radixlang_runtime.tool_parsers.minimax_m3 import MiniMaxM3Parser
from radixlang_runtime.tool_parsers.mistral import MistralParser
from radixlang_runtime.tool_parsers.olmo3 import Olmo3Parser
from radixlang_runtime.tool_parsers.phi4_mini import Phi4MiniJsonParser
from radixlang_runtime.tool_parsers.pythonic import PythonicParser
from radixlang_runtime.tool_parsers.qwen3_coder import Qwen3CoderParser, SeedOssParser
from radixlang_runtime.tool_parsers.step3 import Step3Parser
from radixlang_runtime.tool_parsers.xlam import XlamParser

PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser, "qwen25": HermesParser, "qwen": HermesParser,
    "llama3": Llama3JsonParser, "mistral": MistralParser, "pythonic": PythonicParser,
    "qwen3_coder": Qwen3CoderParser, "deepseekv3": DeepSeekV3Parser, "deepseekv31": DeepSeekV31Parser,
    "kimi_k2": KimiK2Parser, "glm45": Glm45Parser, "gpt-oss": GptOssParser,
    "glm47": Glm47Parser, "minimax-m2": MiniMaxM2Parser, "deepseekv32": DeepSeekV32Parser,
    "seed_oss": SeedOssParser, "step3": Step3Parser, "deepseekv4": DeepSeekV4Parser,
    "minimax-m3": MiniMaxM3Parser, "lfm2": Lfm2Parser, "gemma4": Gemma4Parser,
    "granite": GraniteParser, "phi4_mini_json": Phi4MiniJsonParser, "olmo3": Olmo3Parser,
    "xlam": XlamParser, "kimi_k3": KimiK3Parser, "jamba": JambaParser, "internlm": InternlmParser,
    "cohere_command4": CohereCommand4Parser, "gigachat3": GigaChat3Parser, "longcat": LongcatParser,
    "functiongemma": FunctionGemmaParser, "apertus": ApertusParser, "dots": DotsParser, "minicpm5": MiniCpm5Parser,
}
# vLLM's names where they differ, and the other names either gives a format here: SGLang's `glm` (GLM-4.5) and
# `step3p5` (Step-3.5 writes Qwen3-Coder's calls), vLLM's `qwen3_xml` (Qwen3-Coder), `llama3_json` / `llama4_json`
# (Llama 3.1's JSON), `openai` (gpt-oss), `granite4` (Granite 4.0 writes Hermes' blocks), `hunyuan_a13b`
# (Hunyuan-A13B writes Jamba's group), `ernie45` (ERNIE-4.5 writes Hermes' blocks), SGLang's `mimo` (MiMo writes
# Qwen3-Coder's calls) and its `apertus2509` (vLLM's `apertus`), and vLLM's `cohere_command3` (Command A writes the
# action block cohere_command4 reads)
ALIASES = {"minimax_m2": "minimax-m2", "deepseek_v32": "deepseekv32", "deepseek_v4": "deepseekv4",
           "minimax_m3": "minimax-m3", "glm": "glm45", "step3p5": "qwen3_coder", "qwen3_xml": "qwen3_coder",
           "llama3_json": "llama3", "llama4_json": "llama3", "openai": "gpt-oss",
           "granite4": "hermes", "hunyuan_a13b": "jamba", "ernie45": "hermes", "mimo": "qwen3_coder",
           "apertus2509": "apertus", "cohere_command3": "cohere_command4"}
PARSERS.update({alias: PARSERS[name] for alias, name in ALIASES.items()})

# (texts that all appear in a chat template, the parser they imply), first match wins. Kimi K2's first template
# declares tools (`tool_declare`) but writes no call markup; gpt-oss's writes the recipient `to=` and
# `functions.NAME` as separate strings, so neither is looked for whole. Seed-OSS writes Qwen3-Coder's tags inside
# its own block; GLM-4.7 writes GLM-4.5's tags back to back; DeepSeek V3.2's template builds its tags from a
# `｜DSML｜` variable, so only that token is looked for (V4's writes `tool_calls>` after it). Command R7B, Command A
# and their successors write `<|START_ACTION|>` groups (cohere_command4's reading); FireFunction v2 writes
# Phi-4-mini's `functools[` list. GigaChat 3's template is told by its two separator tokens. `<tool_calls>` alone is
# not looked for: Jamba, MiniMax-M1 and MiMo write different groups in it; nor are MiniCPM's `<function name=` tags.
_TEMPLATE_HINTS = ((("<seed:tool_call>",), "seed_oss"), (("<longcat_tool_call>",), "longcat"),
                   (("<dots_function_call>",), "dots"),
                   (("]<]minimax[>[",), "minimax-m3"),
                   (("<minimax:tool_call>",), "minimax-m2"),
                   (("｜DSML｜", "tool_calls>"), "deepseekv4"), (("｜DSML｜",), "deepseekv32"),
                   (("<steptml:invoke",), "step3"), (("<|tool_call>",), "gemma4"),
                   (("<start_function_call>",), "functiongemma"), (("<|message_sep|>", "<|role_sep|>"), "gigachat3"),
                   (("<function=", "<parameter="), "qwen3_coder"), (("</arg_key><arg_value>",), "glm47"),
                   (("<arg_key>",), "glm45"), (("<function_calls>",), "olmo3"),
                   (("<|tool_call_start|>",), "lfm2"), (("<|tool_call|>",), "granite"),
                   (("<|action_start|>", "<|plugin|>"), "internlm"), (("<|START_ACTION|>",), "cohere_command4"),
                   (("<|tools_prefix|>",), "apertus"),
                   (("<|open|>", "<|close|>", "<|sep|>"), "kimi_k3"), (("functools[",), "phi4_mini_json"),
                   (("<tool_call>",), "hermes"), (("[TOOL_CALLS]",), "mistral"),
                   (("<|python_start|>",), "pythonic"), (("<|python_tag|>",), "llama3"),
                   (("<｜tool▁sep｜>", "```json"), "deepseekv3"), (("<｜tool▁sep｜>",), "deepseekv31"),
                   (("<|tool_calls_section_begin|>",), "kimi_k2"), (("tool_declare<|im_middle|>",), "kimi_k2"),
                   (("<|start|>assistant", "<|channel|>"), "gpt-oss"))


def get_parser(name: str) -> type[ToolParser]:
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; known: {', '.join(sorted(PARSERS))}") from None


def detect_parser(chat_template: Optional[str]) -> Optional[str]:
    """The parser a chat template's tool markup implies, or None."""
    for hints, name in _TEMPLATE_HINTS:
        if chat_template and all(h in chat_template for h in hints):
            return name
    return None


__all__ = ["PARSERS", "ALIASES", "get_parser", "detect_parser", "ToolParser", "ToolCall", "ParseResult", "Event",
           "Text", "CallStart", "CallArgs", "CallSyntax", "collect", "openai_delta"]
