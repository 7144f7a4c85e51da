"""`tools`, `tool_choice`, `parallel_tool_calls` of /v1/chat/completions (no torch).

check_tools validates the request's part once (400 naming the field); ToolPlan says how one request
renders and parses: tool_choice "none" (or no tools) renders no tools and parses nothing; "auto"
renders them and parses the output with the server's tool-call parser (--tool-call-parser, else the one
the chat template's markup implies, tool_parsers.detect_parser). "required" and a named function are
refused for now (they need grammar-constrained calls). A reply with calls is
`message.tool_calls` (content: the text outside the markup, or null) and finish_reason "tool_calls"
(a reply cut by max_tokens keeps "length"); `parallel_tool_calls: false` keeps the first call only.
Streams send the same through ToolStream: content deltas, then per call one delta with id, type and
name, then its arguments in pieces (tool_parsers.base states when a stream and a whole parse agree).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from radixlang_runtime.limits import FieldError, need_bool, show
from radixlang_runtime.tool_parsers import CallArgs, CallStart, Event, ToolParser, detect_parser, get_parser, \
    openai_delta

MAX_TOOLS = 128  # OpenAI's limit
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's function-name rule
_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}


@dataclass
class ToolPlan:
    tools: list[dict] = field(default_factory=list)  # rendered into the prompt (empty: none)
    parser: Optional[type[ToolParser]] = None  # None: the output is plain text
    names: set[str] = field(default_factory=set)
    parallel: bool = True

    def message(self, text: str, finish: Optional[str]) -> tuple[dict, Optional[str]]:
        """A finished choice's text -> (its `message`, its finish_reason)."""
        if self.parser is None:
            return {"role": "assistant", "content": text}, finish
        result = self.parser.parse(text, self.names)
        calls = result.calls if self.parallel else result.calls[:1]
        if not calls:
            return {"role": "assistant", "content": result.content}, finish
        return ({"role": "assistant", "content": result.content or None,
                 "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                for c in calls]},
                "tool_calls" if finish == "stop" else finish)

    def stream(self) -> Optional["ToolStream"]:
        return ToolStream(self.parser(self.names), self.parallel) if self.parser is not None else None


class ToolStream:
    """One streamed choice: text deltas in, OpenAI `delta` objects out."""

    def __init__(self, parser: ToolParser, parallel: bool):
        self.parser, self.parallel = parser, parallel
        self.called = False

    def feed(self, text: str) -> list[dict]:
        return self._deltas(self.parser.feed(text)) if text else []

    def finish(self) -> list[dict]:
        return self._deltas(self.parser.finish())

    def finish_reason(self, finish: Optional[str]) -> Optional[str]:
        return "tool_calls" if self.called and finish == "stop" else finish

    def _deltas(self, events: list[Event]) -> list[dict]:
        out = []
        for e in events:
            if isinstance(e, (CallStart, CallArgs)):
                if e.index > 0 and not self.parallel:
                    continue
                self.called = True
            out.append(openai_delta(e))
        return out


def _check_tool(t: Any, i: int) -> dict:
    where = f"tools[{i}]"
    fn = t.get("function") if isinstance(t, dict) else None
    if not isinstance(fn, dict) or t.get("type") != "function" or set(t) - {"type", "function"}:
        raise FieldError("tools", f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\", "
                                  f"\"description\", \"parameters\"}}}}, got {show(t)}")
    if unknown := sorted(set(fn) - _FUNCTION_KEYS):
        raise FieldError("tools", f"{where}.function: unknown field(s) {', '.join(show(u, 40) for u in unknown)}")
    name = fn.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise FieldError("tools", f"{where}.function.name must be 1-64 letters, digits, _ or -, got {show(name)}")
    if not isinstance(fn.get("description", ""), str):
        raise FieldError("tools", f"{where}.function.description must be a string")
    if not isinstance(fn.get("parameters", {}), dict):
        raise FieldError("tools", f"{where}.function.parameters must be a JSON Schema object")
    if fn.get("strict") is not None:
        need_bool(fn["strict"], f"{where}.function.strict")
    return {"type": "function", "function": {k: v for k, v in fn.items() if k != "strict"}}


def check_tools(body: dict) -> ToolPlan:
    """The request's tools part -> its ToolPlan, its parser still unset (set_parser, once the template
    the request renders with is known)."""
    tools = body.get("tools")
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise FieldError("tools", f"tools must be a list, got {show(tools)}")
    if len(tools) > MAX_TOOLS:
        raise FieldError("tools", f"tools may hold at most {MAX_TOOLS} functions, got {len(tools)}")
    checked = [_check_tool(t, i) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in checked]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise FieldError("tools", f"tools: function names must be unique, {show(dup[0])} appears twice")
    choice = body.get("tool_choice")
    choice = ("auto" if checked else "none") if choice is None else choice
    parallel = body.get("parallel_tool_calls")
    parallel = True if parallel is None else need_bool(parallel, "parallel_tool_calls")
    if isinstance(choice, dict) or choice == "required":
        raise FieldError("tool_choice", f"tool_choice {show(choice)} is not supported yet: it needs grammar-"
                                        "constrained tool calls (use \"auto\" or \"none\")")
    if choice not in ("none", "auto"):
        raise FieldError("tool_choice", f"tool_choice must be \"none\", \"auto\", \"required\" or "
                                        f"{{\"type\": \"function\", \"function\": {{\"name\"}}}}, got {show(choice)}")
    if choice == "none" or not checked:
        return ToolPlan(parallel=parallel)
    return ToolPlan(checked, None, set(names), parallel)


def set_parser(plan: ToolPlan, parser_name: Optional[str], template: Optional[str]) -> None:
    """plan.parser: --tool-call-parser, else what the template's markup implies (a plan with tools only)."""
    if not plan.tools:
        return
    name = parser_name or detect_parser(template)
    if name is None:
        raise FieldError("tools", "tools need a tool-call parser: none could be told from the chat template; start the "
                                  "server with --tool-call-parser (hermes, llama3, mistral, pythonic, qwen25)")
    plan.parser = get_parser(name)
