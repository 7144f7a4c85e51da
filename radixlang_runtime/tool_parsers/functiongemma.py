"""FunctionGemma (google/functiongemma-270m-it) tool calls: Gemma 4's call syntax in FunctionGemma's own tokens,
one call per token pair, calls back to back, text around them is content:
  <start_function_call>call:get_weather{city:<escape>Paris<escape>,days:2}<end_function_call>
Its chat template writes a string value between two `<escape>` tokens and other values bare (numbers, true /
false, `{k:v}` objects, `[...]` arrays), as Gemma 4 does; values read as gemma4.py reads them (a string as
written; vLLM's functiongemma also reads JSON inside `<escape>` and drops bare values). The close token may be
missing at the very end. No CallSyntax: tool_choice cannot force it. No torch."""

from __future__ import annotations

from radixlang_runtime.tool_parsers.gemma4 import Gemma4Parser

START, END, ESCAPE = "<start_function_call>", "<end_function_call>", "<escape>"


class FunctionGemmaParser(Gemma4Parser):
    name = "functiongemma"
    start, end, quote = START, END, ESCAPE
    markers = (START,)
