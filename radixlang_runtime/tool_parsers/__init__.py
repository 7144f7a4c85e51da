"""Tool-call parsers by format name (SGLang's --tool-call-parser names) and detection from a chat
template. No torch."""

from __future__ import annotations

from typing import Optional

from radixlang_runtime.tool_parsers.base import (CallArgs, CallStart, CallSyntax, Event, ParseResult, Text, ToolCall,
                                                 ToolParser, collect, openai_delta)
from radixlang_runtime.tool_parsers.hermes import HermesParser
from radixlang_runtime.tool_parsers.llama3 import Llama3JsonParser
from radixlang_runtime.tool_parsers.mistral import MistralParser
from radixlang_runtime.tool_parsers.pythonic import PythonicParser

PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser, "qwen25": HermesParser, "qwen": HermesParser,
    "llama3": Llama3JsonParser, "mistral": MistralParser, "pythonic": PythonicParser,
}

# (text in a chat template, the parser it implies), first match wins
_TEMPLATE_HINTS = (("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral"), ("<|python_start|>", "pythonic"),
                   ("<|python_tag|>", "llama3"))


def get_parser(name: str) -> type[ToolParser]:
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; known: {', '.join(sorted(PARSERS))}") from None


def detect_parser(chat_template: Optional[str]) -> Optional[str]:
    """The parser a chat template's tool markup implies, or None."""
    for hint, name in _TEMPLATE_HINTS:
        if chat_template and hint in chat_template:
            return name
    return None


__all__ = ["PARSERS", "get_parser", "detect_parser", "ToolParser", "ToolCall", "ParseResult", "Event", "Text",
           "CallStart", "CallArgs", "CallSyntax", "collect", "openai_delta"]
