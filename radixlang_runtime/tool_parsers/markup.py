"""Pieces shared by the formats whose calls are special-token markup (DeepSeek, Kimi K2, gpt-oss) or XML with
typed parameter values (Qwen3-Coder, GLM-4.5): reading a literal or a delimited field as the text grows, a JSON
arguments object committed as soon as it begins, parameter values converted by the tool's JSON schema, and the
section layout `open (call_open HEADER args_open {json} call_close)+ close` (no torch)."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from radixlang_runtime.tool_parsers.base import DONE, INVALID, OPEN, CallScan, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.json_scan import COMPLETE, PARTIAL, skip_ws

MAX_HEADER = 256  # characters a function name / parameter key may take before the markup is not a call
XML_KEY = re.compile(r"[^\s<>=]+")  # a parameter key of the XML formats (Qwen3-Coder: its function names too)


def expect(text: str, i: int, lit: str, final: bool) -> tuple[str, int]:
    """lit at text[i:] -> (COMPLETE, one past it) / (OPEN, len: a proper prefix of it ends the text) /
    (INVALID, i)."""
    if text.startswith(lit, i):
        return COMPLETE, i + len(lit)
    if not final and lit.startswith(text[i:]):
        return OPEN, len(text)
    return INVALID, i


def read_until(text: str, i: int, delim: str, final: bool, limit: int = MAX_HEADER) -> tuple[str, int]:
    """A field from text[i] up to delim -> (COMPLETE, where delim starts) / (OPEN, len) / (INVALID, i):
    delim missing at the end, or the field longer than limit."""
    j = text.find(delim, i, i + limit + len(delim))
    if j >= 0:
        return COMPLETE, j
    if final or len(text) - i > limit + len(delim):
        return INVALID, i
    return OPEN, len(text)


def json_args_at(parser: ToolParser, text: str, i: int, final: bool, name: str,
                 calls: list[CallScan]) -> tuple[str, int]:
    """A call's JSON arguments object at text[i:] (whitespace first): the call is appended once "{" is read
    -> (COMPLETE, one past "}") / (OPEN, len) / (INVALID, index)."""
    scan = parser.scan_at(text, i)
    if scan.start >= len(text):
        return (INVALID if final else OPEN), len(text)
    if text[scan.start] != "{" or scan.status == INVALID or (final and scan.status == PARTIAL):
        return INVALID, scan.end
    calls.append(CallScan(name, text[scan.start:scan.end], scan.status == COMPLETE))
    return (COMPLETE, scan.end) if scan.status == COMPLETE else (OPEN, len(text))


def known(parser: ToolParser, name: str) -> bool:
    return bool(name) and (parser.tool_names is None or name in parser.tool_names)


# ---------------------------------------------------------------------- typed parameter values (XML formats)
def _no_constant(name: str) -> Any:
    raise ValueError(name)  # NaN / Infinity are not JSON


def read_json(raw: str) -> Any:
    """raw read as JSON (NaN / Infinity refused), else the class ValueError (None is a value)."""
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except ValueError:
        return ValueError


def loose_value(raw: str) -> Any:
    """A value with no usable schema type: JSON, else a Python literal, else the text itself."""
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:
        value = ast.literal_eval(raw)
        json.dumps(value)
        return value
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return raw


def typed_value(raw: str, schema: Optional[dict]) -> Any:
    """A parameter's text -> its value by the parameter's schema "type": strings stay text, integers / numbers
    / booleans / objects / arrays are read (null is None for a non-string); text that does not read as its type
    stays text (the client validates arguments)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    kinds = kind if isinstance(kind, list) else [kind]
    if "string" in kinds and not (raw == "null" and "null" in kinds):
        return raw
    if kind is None or raw == "null":
        return loose_value(raw)
    if raw in ("true", "True", "false", "False") and "boolean" in kinds:
        return raw.lower() == "true"
    for k, read in (("integer", int), ("number", float)):
        if k in kinds:
            try:
                return read(raw)
            except ValueError:
                pass
    if "number" in kinds or "integer" in kinds:
        return raw
    return loose_value(raw)


def param_schema(parser: ToolParser, name: str, key: str) -> Optional[dict]:
    props = (parser.schemas.get(name) or {}).get("properties")
    return props.get(key) if isinstance(props, dict) else None


def arguments_json(items: list[tuple[str, Any]], complete: bool) -> str:
    """Parameters read so far -> the arguments' JSON text (a prefix of the final one while incomplete)."""
    body = ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}" for k, v in items)
    return "{" + body + ("}" if complete else "")


# ---------------------------------------------------------------------- the section layout (DeepSeek, Kimi K2)
@dataclass(frozen=True)
class Section:
    open: str  # the group's start marker
    call_open: str
    args_open: str  # ends the header (the name, with a prefix / suffix read_name strips)
    call_close: str
    close: str
    args_close: str = ""  # between the JSON object and call_close (whitespace around it is allowed)


def parse_section(parser: ToolParser, sec: Section, read_name: Callable[[str], Optional[str]], text: str,
                  final: bool) -> GroupScan:
    """text starts at sec.open: its calls, each `call_open HEADER args_open {...} args_close call_close`,
    then sec.close (accepted missing at the very end: the model stopped on it). The complete calls are kept
    (the parser's scanner cache) and the next delta resumes after them: a streamed section costs linear time."""
    state = parser._scanners.setdefault(("section", 0), [len(sec.open), []])  # [resume index, complete calls]
    i, calls = state[0], list(state[1])
    while True:
        i = skip_ws(text, i)
        if calls and i == len(text):
            return GroupScan(calls, DONE if final else OPEN, i)
        st, j = expect(text, i, sec.close, final)
        if st == COMPLETE and calls:
            return GroupScan(calls, DONE, j)
        if st == OPEN and calls and not text.startswith(sec.call_open[:len(text) - i], i):
            return GroupScan(calls, OPEN, j)
        st, j = expect(text, i, sec.call_open, final)
        if st != COMPLETE:
            return GroupScan(calls, st, j)
        st, k = read_until(text, j, sec.args_open, final)
        if st != COMPLETE:
            return GroupScan(calls, st, k)
        name = read_name(text[j:k])
        if name is None or not known(parser, name):
            return GroupScan(calls, INVALID, j)
        st, end = json_args_at(parser, text, k + len(sec.args_open), final, name, calls)
        if st != COMPLETE:
            return GroupScan(calls, st, end)
        for lit in (sec.args_close, sec.call_close):
            if lit:
                st, end = expect(text, skip_ws(text, end), lit, final)
                if st != COMPLETE:
                    return GroupScan(calls, st, end)
        i = state[0] = end
        state[1] = list(calls)
