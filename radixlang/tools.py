"""Tools in the DSL: `gen(name, tools=[fn, ...], tool_choice=...)` (no torch).

A tool is a Python function with type hints; its JSON schema comes from the signature (str, int, float,
bool, Literal[...], Optional[...], list[...]; a parameter with a default is optional) and its docstring (the
first paragraph describes the function, `Args:` lines `name: text` describe parameters). A gen with tools
runs inside `sgl.assistant(...)`: the conversation so far (the program's messages) is rendered with the
model's own Jinja chat template and the tools, as the server's chat route renders them (a ChatML template
that cannot show tools gets the runtime's CHATML_TOOLS_TEMPLATE), that text is the prompt of this gen, and
the output is read by the tool-call parser the template implies. tool_choice "required" or {"name": ...}
constrains the output to a call with the forced-call regex the chat route uses (sent as `regex`).
The variable holds the first call (a ToolCall: name, arguments checked against the function's signature,
ValueError naming the problem otherwise) or, when the model answered in text, that text;
`state.tool_calls(name)` lists every call. Running a tool is the program's choice."""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Union

_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"))
_ARGS_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


def _describe(fn: Callable) -> tuple[str, dict[str, str]]:
    doc = inspect.getdoc(fn) or ""
    head, _, rest = doc.partition("\nArgs:")
    params: dict[str, str] = {}
    for line in rest.splitlines():
        if line.strip() and not line.startswith((" ", "\t")):
            break  # the next section
        m = _ARGS_LINE.match(line)
        if m:
            params[m.group(1)] = m.group(2).strip()
    return " ".join(head.split("\n\n")[0].split()), params


def _type_schema(tp: Any, where: str) -> dict:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    for py, name in _JSON_TYPES:
        if tp is py:
            return {"type": name}
    if origin is Literal:
        if not all(a is None or isinstance(a, (str, int, float, bool)) for a in args):
            raise ValueError(f"{where}: Literal values must be str, int, float, bool or None")
        return {"enum": list(args)}
    if origin in (Union, types.UnionType) and type(None) in args and len(args) == 2:
        inner = _type_schema(next(a for a in args if a is not type(None)), where)
        if "enum" in inner:
            return {"enum": [*inner["enum"], None]}
        if isinstance(inner.get("type"), str):
            return {**inner, "type": [inner["type"], "null"]}
        raise ValueError(f"{where}: Optional of {tp!r} is not supported")
    if origin is list or tp is list:
        return {"type": "array", **({"items": _type_schema(args[0], where)} if args else {})}
    raise ValueError(f"{where}: type {tp!r} is not supported (str, int, float, bool, Literal, Optional, list)")


def _hints(fn: Callable) -> tuple[str, dict[str, Any], inspect.Signature]:
    name = getattr(fn, "__name__", None)
    if not callable(fn) or not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise ValueError(f"a tool must be a named Python function, got {fn!r}")
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise ValueError(f"tool {name}: parameter {p.name!r} must be passable by keyword")
        if p.name not in hints:
            raise ValueError(f"tool {name}: parameter {p.name!r} needs a type hint")
    return name, hints, sig


def function_tool(fn: Callable) -> dict:
    """A function -> its OpenAI tool {"type": "function", "function": {name, description, parameters}}."""
    name, hints, sig = _hints(fn)
    text, docs = _describe(fn)
    props, required = {}, []
    for p in sig.parameters.values():
        props[p.name] = _type_schema(hints[p.name], f"tool {name}: parameter {p.name!r}")
        if p.name in docs:
            props[p.name]["description"] = docs[p.name]
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    params = {"type": "object", "properties": props, "required": required}
    return {"type": "function", "function": {"name": name, "description": text, "parameters": params}}


def _check_value(tp: Any, v: Any, where: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is float and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    for py, name in _JSON_TYPES:
        if tp is py:
            if type(v) is not py:
                raise ValueError(f"{where} must be {name}, got {json.dumps(v)}")
            return v
    if origin is Literal:
        if v not in args or any(type(v) is not type(a) for a in args if a == v):
            raise ValueError(f"{where} must be one of {list(args)}, got {json.dumps(v)}")
        return v
    if origin in (Union, types.UnionType):
        return None if v is None else _check_value(next(a for a in args if a is not type(None)), v, where)
    if origin is list or tp is list:
        if not isinstance(v, list):
            raise ValueError(f"{where} must be a list, got {json.dumps(v)}")
        return [_check_value(args[0], x, f"{where}[{i}]") for i, x in enumerate(v)] if args else v
    raise ValueError(f"{where}: unsupported type {tp!r}")


def check_arguments(fn: Callable, arguments: Any) -> dict:
    """A call's arguments checked against fn's signature -> the keyword arguments to call it with
    (ValueError naming the problem)."""
    name, hints, sig = _hints(fn)
    if not isinstance(arguments, dict):
        raise ValueError(f"{name}: arguments must be a JSON object, got {json.dumps(arguments)}")
    if unknown := sorted(set(arguments) - set(sig.parameters)):
        raise ValueError(f"{name}: unknown argument {unknown[0]!r}")
    out = {}
    for p in sig.parameters.values():
        if p.name not in arguments:
            if p.default is inspect.Parameter.empty:
                raise ValueError(f"{name}: missing argument {p.name!r}")
            continue
        out[p.name] = _check_value(hints[p.name], arguments[p.name], f"{name}: argument {p.name!r}")
    return out


@dataclass
class ToolRequest:
    """One gen's tools, checked when the program is built."""
    functions: dict[str, Callable]
    choice: Any  # "auto" / "required" / {"name": ...} (or OpenAI's {"type": "function", "function": {"name"}})
    tools: list[dict]

    @classmethod
    def make(cls, tools: Any, tool_choice: Any) -> "ToolRequest":
        if not isinstance(tools, (list, tuple)) or not tools:
            raise ValueError("tools must be a non-empty list of functions")
        specs = [function_tool(fn) for fn in tools]
        functions = {s["function"]["name"]: fn for s, fn in zip(specs, tools)}
        if len(functions) != len(specs):
            raise ValueError("tools: function names must be unique")
        choice = "auto" if tool_choice is None else tool_choice
        if isinstance(choice, dict) and set(choice) == {"name"}:
            choice = {"type": "function", "function": {"name": choice["name"]}}
        from radixlang_runtime.server.openai_tools import check_tools

        check_tools({"tools": specs, "tool_choice": choice})  # FieldError (a ValueError) naming the problem
        return cls(functions, choice, specs)

    def render(self, jinja_template: Optional[str], messages: list[dict]) -> tuple[str, str, bool]:
        """The conversation with the tools -> (prompt text up to the assistant turn, parser name, list form)."""
        from radixlang_runtime.chat_tools_template import CHATML_TOOLS_TEMPLATE, template_with_tools
        from radixlang_runtime.tool_parsers import detect_parser

        template = template_with_tools(jinja_template or "")
        if template is None:
            raise ValueError("gen(tools=...) needs the model's Jinja chat template to render tools; the backend "
                             "reports none that can (/get_model_info chat_template)")
        parser = detect_parser(template)
        if parser is None:
            raise ValueError("gen(tools=...): no tool-call format can be told from the model's chat template")
        return _render_jinja(template, messages, self.tools), parser, template == CHATML_TOOLS_TEMPLATE

    def forced_regex(self, parser: str, list_form: bool) -> Optional[str]:
        """The regex a required / named tool_choice constrains the output to (None: "auto")."""
        from radixlang_runtime.server.openai_tools import check_tools, forced_call_regex, with_parser

        plan = check_tools({"tools": self.tools, "tool_choice": self.choice})
        if plan.forced is None:
            return None
        plan = with_parser(plan, parser, None)
        return forced_call_regex(plan, list_form)

    def read(self, output: str, parser: str) -> tuple[list[ToolCall], str]:
        """The model's output -> (its calls, arguments checked against each function; the text outside)."""
        from radixlang_runtime.tool_parsers import get_parser

        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in self.tools}
        result = get_parser(parser).parse(output, set(self.functions), schemas=schemas)
        calls = [ToolCall(c.name, check_arguments(self.functions[c.name], json.loads(c.arguments)), c.id)
                 for c in result.calls]
        return calls, result.content


def _render_jinja(template: str, messages: list[dict], tools: list[dict]) -> str:
    """Render as transformers' apply_chat_template does (trim_blocks, lstrip_blocks, its tojson)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(messages=messages, tools=tools, add_generation_prompt=True,
                                                bos_token="", eos_token="")
    except jinja2.TemplateError as e:
        raise ValueError(f"the chat template refused these messages: {e}") from None
