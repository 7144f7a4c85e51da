"""`tools`, `tool_choice`, `parallel_tool_calls` of /v1/chat/completions (no torch).

check_tools validates the request's part once (400 naming the field); ToolPlan says how one request
renders and parses: tool_choice "none" (or no tools) renders no tools and parses nothing; "auto"
renders them and parses the output with the server's tool-call parser (--tool-call-parser, else the one
the chat template's markup implies, tool_parsers.detect_parser). "required" and a named function
(`{"type": "function", "function": {"name"}}`) constrain the output with a regex (forced_call_regex:
the layout the parser states once, ToolParser.call_syntax, around the parameters schema as a regex: JSON
arguments, Python keyword arguments for pythonic, or XML parameters for qwen3_coder / seed_oss / glm45 / glm47 /
minimax-m2: a string-typed value as text without `<`, others as JSON), so the reply is a valid call of those
functions in every format (hermes' one-call-per-block and the embedded model's list form, llama3, mistral,
pythonic, the XML and special-token formats), for parameter schemas without combinators / $ref (their regexes
are built in this process: the keywords that can blow a regex up are refused by name).
A reply with calls is
`message.tool_calls` (content: the text outside the markup, or null) and finish_reason "tool_calls"
(a reply cut by max_tokens keeps "length"); `parallel_tool_calls: false` keeps the first call only.
Streams send the same through ToolStream: content deltas, then per call one delta with id, type and
name, then its arguments in pieces (tool_parsers.base states when a stream and a whole parse agree).
"""

from __future__ import annotations

import dataclasses

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from radixlang_runtime.protocol.limits import FieldError, need_bool, show
from radixlang_runtime.tool_parsers import PARSERS, CallArgs, CallStart, Event, ToolParser, detect_parser, get_parser, \
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
    forced: Optional[str] = None  # tool_choice "required" or the named function: the output must be a call
    past_calls: int = 0  # the tool calls in the messages (Kimi K2 numbers its call ids on from them)

    def message(self, text: str, finish: Optional[str]) -> tuple[dict, Optional[str]]:
        """A finished choice's text -> (its `message`, its finish_reason)."""
        if self.parser is None:
            return {"role": "assistant", "content": text}, finish
        result = self.parser.parse(text, self.names, schemas=self.schemas, past_calls=self.past_calls)
        calls = result.calls if self.parallel else result.calls[:1]
        if not calls:
            return {"role": "assistant", "content": result.content}, finish
        return ({"role": "assistant", "content": result.content or None,
                 "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                for c in calls]},
                "tool_calls" if finish == "stop" else finish)

    def stream(self) -> Optional["ToolStream"]:
        return ToolStream(self.parser(self.names, schemas=self.schemas, past_calls=self.past_calls), self.parallel) \
            if self.parser is not None else None

    @property
    def schemas(self) -> dict[str, dict]:
        """Each function's parameters schema (formats whose values are typed text read them by it)."""
        return {t["function"]["name"]: t["function"].get("parameters") or {} for t in self.tools}


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
    """The request's tools part -> its ToolPlan, its parser still unset (with_parser, once the template
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
    forced = _forced_choice(choice, names)
    if choice == "none" or not checked:
        return ToolPlan(parallel=parallel)
    return ToolPlan(checked, None, set(names), parallel, forced, _past_calls(body.get("messages")))


def _past_calls(messages: Any) -> int:
    """The tool calls of the messages' assistant turns (the messages are checked where they are rendered)."""
    turns = messages if isinstance(messages, list) else []
    return sum(len(m["tool_calls"]) for m in turns
               if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list))


def _forced_choice(choice: Any, names: list[str]) -> Optional[str]:
    """tool_choice -> None (none / auto), "required", or the name of the function it names."""
    if choice in ("none", "auto"):
        return None
    if choice == "required":
        if not names:
            raise FieldError("tool_choice", "tool_choice \"required\" needs tools")
        return "required"
    fn = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(fn, dict) or choice.get("type") != "function" or not isinstance(fn.get("name"), str):
        raise FieldError("tool_choice", f"tool_choice must be \"none\", \"auto\", \"required\" or "
                                        f"{{\"type\": \"function\", \"function\": {{\"name\"}}}}, got {show(choice)}")
    if fn["name"] not in names:
        raise FieldError("tool_choice", f"tool_choice names {show(fn['name'])}, which is not in tools")
    return fn["name"]


def with_parser(plan: ToolPlan, parser_name: Optional[str], template: Optional[str]) -> ToolPlan:
    """The plan with its parser: --tool-call-parser, else what the template's markup implies (a plan with tools
    only; one without is returned as it is)."""
    if not plan.tools:
        return plan
    name = parser_name or detect_parser(template)
    if name is None:
        raise FieldError("tools", "tools need a tool-call parser: none could be told from the chat template; start the "
                                  "server with --tool-call-parser (" + ", ".join(sorted(PARSERS)) + ")")
    return dataclasses.replace(plan, parser=get_parser(name))


MAX_FORCED_SCHEMA_CHARS = 8192  # a forced call's parameters schema (canonical JSON), per function
_BLOWUP_KEYS = ("anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions")


_PY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a Python identifier: pythonic calls' names and keywords
_CALL_NUMBER = "(?:0|[1-9][0-9]{0,5})"  # a call's number the model writes (CallSyntax.index)


def _literal(text: str) -> str:
    """Text as a regex matching exactly it (the escapes both Rust's and Python's regex read)."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", text)


def _parameters(fn: dict) -> dict:
    """A function's parameters schema, checked for a forced call (ValueError naming what is refused)."""
    from radixlang_runtime.constrained.schema import canonical_schema, check_schema

    canonical = canonical_schema(fn.get("parameters") or {"type": "object", "properties": {}})
    if len(canonical) > MAX_FORCED_SCHEMA_CHARS:
        raise ValueError(f"at most {MAX_FORCED_SCHEMA_CHARS} characters with a forced tool_choice")
    if hits := sorted({k for k in _BLOWUP_KEYS if f'"{k}":' in canonical}):
        raise ValueError(f"{hits[0]} is not supported with a forced tool_choice")
    params = json.loads(canonical)
    check_schema(params)
    if params.get("type") != "object":
        raise ValueError('must be {"type": "object", ...}')
    return params


def _properties(params: dict, form: str) -> tuple[dict, set]:
    """A parameters object's (properties, required names), refusing what a form that names each parameter
    cannot honour (form: the format's name in the message)."""
    props, required = params.get("properties") or {}, set(params.get("required") or ())
    binding = {"additionalProperties": params.get("additionalProperties") not in (None, False),
               "minProperties": params.get("minProperties", 0) > len(required & set(props)),
               "maxProperties": params.get("maxProperties", len(props)) < len(props)}
    if hits := [k for k, b in binding.items() if b]:
        raise ValueError(f"{hits[0]} is not supported with {form} forced calls (parameters are named one by one)")
    return props, required


def _in_order(items: list[tuple[bool, str]], sep: str) -> str:
    """(required, regex) per property in the schema's order -> the regex of those present, `sep` between
    two: each required one always, each optional one present or not."""
    alts = []  # by the first item present: it, then each later one (required: always, optional: maybe)
    for k, (req, item) in enumerate(items):
        alts.append(item + "".join(f"{sep}{it}" if r else f"(?:{sep}{it})?" for r, it in items[k + 1:]))
        if req:
            break
    if all(not r for r, _ in items):
        alts.append("")
    return "(?:" + "|".join(f"(?:{a})" for a in alts) + ")"


def _keywords_regex(params: dict) -> str:
    """An object schema -> the regex of its keyword arguments `k=v, ...` (Python literals), in the schema's
    property order, each optional property present or not."""
    from radixlang_runtime.constrained.schema import schema_to_regex

    props, required = _properties(params, "pythonic")
    items = []
    for key, sub in props.items():
        if not _PY_NAME.fullmatch(key):
            raise ValueError(f"property {key!r} is not a Python identifier (pythonic calls pass keywords)")
        items.append((key in required, key + "=" + schema_to_regex(json.dumps(sub), python=True)))
    return _in_order(items, ", ")


_JSON_CHAR = r'[^"\\\x00-\x1F\x7F-\x9F]'  # a character of a JSON string in schema_to_regex's regexes
_TEXT = "[^<]"  # a character of an XML parameter's text value: `<` could start the closing tag


def _no_markup(node: Any, key: str) -> None:
    """ValueError where a JSON value's schema could write `<` (enum / const / property names, pattern)."""
    if not isinstance(node, dict):
        return
    if "pattern" in node:
        raise ValueError(f"property {key!r}: pattern is not supported with XML forced calls")
    if "<" in json.dumps([node.get("enum"), node.get("const"), *(node.get("properties") or {})]):
        raise ValueError(f"property {key!r}: text with '<' is not supported with XML forced calls")
    for sub in [*(node.get("properties") or {}).values(), node.get("additionalProperties"), node.get("items"),
                *(node.get("prefixItems") or [])]:
        _no_markup(sub, key)


def _text_value_regex(key: str, sub: dict, types: set) -> str:
    """A string-typed parameter's value: its text as it is (no `<`), the literal texts of an enum / const,
    a format's text, within minLength / maxLength."""
    from radixlang_runtime.constrained.string_formats import FORMAT_REGEX

    if "pattern" in sub:
        raise ValueError(f"property {key!r}: pattern is not supported with XML forced calls")
    if "enum" in sub or "const" in sub:
        texts = []
        for v in (sub["enum"] if "enum" in sub else [sub["const"]]):
            if not (isinstance(v, str) or (v is None and "null" in types)) or "<" in (v or ""):
                raise ValueError(f"property {key!r}: enum / const value {v!r} of a string parameter is not "
                                 "text without '<' (XML forced calls write it as it is)")
            texts.append(_literal("null" if v is None else v))
        return "(?:" + "|".join(texts) + ")"
    if "format" in sub:
        return "(?:" + FORMAT_REGEX[sub["format"]] + ")"
    low, high = sub.get("minLength", 0), sub.get("maxLength")
    if high is not None and low > high:
        raise ValueError(f"property {key!r}: minLength {low} is above maxLength {high}")
    return _TEXT + ("*" if not low and high is None else "{%d,%s}" % (low, "" if high is None else high))


def _xml_params_regex(params: dict, tags: tuple[str, str, str]) -> str:
    """An object schema -> the regex of its parameters `open KEY middle VALUE close` (tags), in the schema's
    property order, each optional one present or not; VALUE: a string-typed one's text, others JSON."""
    from radixlang_runtime.constrained.schema import schema_to_regex
    from radixlang_runtime.tool_parsers.markup import XML_KEY

    props, required = _properties(params, "XML")
    items = []
    for key, sub in props.items():
        if not XML_KEY.fullmatch(key):
            raise ValueError(f"property {key!r} is not a parameter key of XML calls (no whitespace, <, > or =)")
        t = sub.get("type")
        types = set([t] if isinstance(t, str) else (t or []))
        if "string" in types:
            value = _text_value_regex(key, sub, types)
        else:
            _no_markup(sub, key)
            value = schema_to_regex(json.dumps(sub, ensure_ascii=False)).replace(_JSON_CHAR, _JSON_CHAR[:-1] + "<]")
        items.append((key in required, _literal(tags[0] + key + tags[1]) + value + _literal(tags[2])))
    return _in_order(items, "")


def _arguments_regex(fn: dict, args: str, tags: tuple[str, str, str]) -> str:
    """A function's parameters schema -> the regex of its arguments (args: CallSyntax.args; tags:
    CallSyntax.param) with fixed separators; FieldError naming the function and what is refused."""
    from radixlang_runtime.constrained.schema import schema_to_regex

    where = f"tools[{fn['name']}].function.parameters"
    try:
        params = _parameters(fn)
        if args == "python":
            return _keywords_regex(params)
        if args == "xml":
            return _xml_params_regex(params, tags)
        return schema_to_regex(json.dumps(params, ensure_ascii=False))
    except ValueError as e:
        raise FieldError("tools", f"{where}: {e}") from None


def forced_call_regex(plan: ToolPlan, list_form: bool) -> str:
    """The regex a forced tool_choice constrains the output to: one call (a named function, or
    parallel_tool_calls false) or one or more, in the layout the server's parser states
    (ToolParser.call_syntax; list_form: the template writes hermes calls as one list)."""
    if plan.parser is None:
        raise FieldError("tool_choice", f"tool_choice {plan.forced!r} needs a tool-call parser")
    syn = plan.parser.call_syntax(list_form)
    if syn is None:
        raise FieldError("tool_choice", f"tool_choice {plan.forced!r} is not supported with the {plan.parser.name} "
                                        "tool-call format: use tool_choice \"auto\"")
    fns = [t["function"] for t in plan.tools if plan.forced in ("required", t["function"]["name"])]
    for fn in fns:
        if syn.args == "python" and not _PY_NAME.fullmatch(fn["name"]):
            raise FieldError("tools", f"tools[{fn['name']}].function.name is not a Python identifier: the "
                                      f"{plan.parser.name} format cannot call it")
    number = _literal(syn.index) + _CALL_NUMBER if syn.index else ""
    call = "(?:" + "|".join(_literal(syn.call_open + fn["name"]) + number + _literal(syn.name_close)
                            + _arguments_regex(fn, syn.args, syn.param) + _literal(syn.call_close) for fn in fns) + ")"
    many = plan.parallel and plan.forced == "required"
    more = "(?:" + _literal(syn.sep) + call + ")*" if many else ""
    return _literal(syn.open) + call + more + _literal(syn.close)
