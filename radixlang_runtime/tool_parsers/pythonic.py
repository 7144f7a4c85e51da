"""Pythonic tool calls (Llama 3.2 / Llama 4's format): the whole output is a Python list of calls with
keyword arguments, `[get_weather(city="Paris", unit='c'), get_time()]`, optionally inside
`<|python_start|>...<|python_end|>`. Values are Python literals (ast.literal_eval: strings, numbers,
True / False / None, lists, dicts, tuples); a call's arguments become the JSON object of its keywords,
sent one keyword at a time while streaming (a call commits at its first complete keyword, or its ")"). No torch."""

from __future__ import annotations

import ast
import json
import re
from typing import Any, ClassVar, Optional

from radixlang_runtime.tool_parsers.base import DONE, INVALID, OPEN, CallScan, CallSyntax, GroupScan, ToolParser
from radixlang_runtime.tool_parsers.json_scan import COMPLETE, PARTIAL, skip_ws
from radixlang_runtime.tool_parsers.llama3 import start_only_group

PY_START, PY_END = "<|python_start|>", "<|python_end|>"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_KEYWORD = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=")
_OPEN, _CLOSE = "([{", ")]}"
_JSON_NAMES = {"true": True, "false": False, "null": None}


class _ValueScanner:
    """A Python literal from text[pos] to the first top-level `,` or `)`, read as the text grows: scan(text)
    -> (COMPLETE, that index) / (PARTIAL, len) / (INVALID, index of an unbalanced bracket); value() is
    its literal_eval, computed once."""

    def __init__(self, pos: int):
        self.i, self.depth, self.quote = pos, [], ""
        self.pos = pos
        self.done: Optional[tuple[str, int]] = None
        self._value: Optional[tuple[bool, Any]] = None

    def scan(self, text: str) -> tuple[str, int]:
        if self.done is not None:
            return self.done
        i, depth, quote = self.i, self.depth, self.quote
        while i < len(text):
            c = text[i]
            if quote:
                if c == "\\":
                    if i + 1 >= len(text):
                        break  # resume at the backslash
                    i += 1
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c in _OPEN:
                depth.append(_CLOSE[_OPEN.index(c)])
            elif c in _CLOSE:
                if not depth:
                    self.done = (COMPLETE, i) if c == ")" else (INVALID, i)
                    return self.done
                if depth.pop() != c:
                    self.done = INVALID, i
                    return self.done
            elif c == "," and not depth:
                self.done = COMPLETE, i
                return self.done
            i += 1
        self.i, self.quote = i, quote
        return PARTIAL, len(text)

    def value(self, text: str, json_names: bool = False) -> tuple[bool, Any]:
        if self._value is None:
            assert self.done is not None and self.done[0] == COMPLETE
            self._value = _literal(text[self.pos:self.done[1]], json_names)
        return self._value


def _arguments(items: list[tuple[str, Any]], complete: bool) -> str:
    body = ", ".join(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in items)
    return "{" + body + ("}" if complete else "")


class _JsonNames(ast.NodeTransformer):
    """`true` / `false` / `null` as the constants they name in JSON."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in _JSON_NAMES:
            return ast.copy_location(ast.Constant(_JSON_NAMES[node.id]), node)
        return node


def _literal(src: str, json_names: bool = False) -> tuple[bool, Any]:
    """A Python literal's value (json_names: `true` / `false` / `null` read too) -> (ok, value)."""
    try:
        tree: Any = src.strip()
        if json_names:
            tree = _JsonNames().visit(ast.parse(tree, mode="eval"))
        value = ast.literal_eval(tree)
        json.dumps(value)  # sets, bytes, complex numbers have no JSON form
        return True, value
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


class PythonicParser(ToolParser):
    name = "pythonic"
    json_names: ClassVar[bool] = False  # values may also be JSON's true / false / null (Olmo 3)
    syntax = CallSyntax("[", ", ", "]", "", "(", ")", args="python")

    def find_group(self, text: str) -> tuple[int, int]:
        return start_only_group(self, text, (PY_START, "["))

    def parse_group(self, text: str, final: bool) -> GroupScan:
        calls: list[CallScan] = []
        i = skip_ws(text, len(PY_START)) if text.startswith(PY_START) else 0
        if i >= len(text):
            return GroupScan(calls, INVALID if final else OPEN, len(text))
        if text[i] != "[":
            return GroupScan(calls, INVALID, i)
        status, end = self.call_list(text, i, final, calls)
        if status != COMPLETE:
            return GroupScan(calls, status, end)
        j = skip_ws(text, end)
        if text.startswith(PY_END, j):
            return GroupScan(calls, DONE, j + len(PY_END))
        if not final and PY_END.startswith(text[j:]):  # <|python_end|> may follow
            return GroupScan(calls, OPEN, len(text))
        return GroupScan(calls, DONE, end)

    def call_list(self, text: str, i: int, final: bool, calls: list[CallScan]) -> tuple[str, int]:
        """`[f(k=v), g()]` at text[i] == "[" -> (COMPLETE, one past "]") / (OPEN, len) / (INVALID, index); each
        call is appended once its name and "(" are read."""
        i += 1
        while True:
            status, end = self._call(text, skip_ws(text, i), final, calls)
            if status != COMPLETE:
                return status, end
            k = skip_ws(text, end)
            if k >= len(text):
                return (INVALID if final else OPEN), len(text)
            if text[k] == "]":
                return COMPLETE, k + 1
            if text[k] != ",":
                return INVALID, k
            i = k + 1

    def _call(self, text: str, j: int, final: bool, calls: list[CallScan]) -> tuple[str, int]:
        """`name(k=v, ...)` at text[j:] -> (COMPLETE, one past ")") / (OPEN, len) / (INVALID, index); the call
        is appended once its name and "(" are read."""
        undecided = (INVALID if final else OPEN), len(text)
        m = _NAME.match(text, j)
        if m is None:
            return undecided if j >= len(text) else (INVALID, j)
        k = skip_ws(text, m.end())
        if k >= len(text):
            return undecided
        if text[k] != "(" or (self.tool_names is not None and m.group() not in self.tool_names):
            return INVALID, k
        items: list[tuple[str, Any]] = []
        call: Optional[CallScan] = None  # committed at its first complete keyword (streaming) or its ")"
        p = k + 1
        while True:
            p = skip_ws(text, p)
            if p < len(text) and text[p] == ")":
                if call is None:
                    call = CallScan(m.group(), "", False)
                    calls.append(call)
                call.args, call.complete = _arguments(items, True), True
                return COMPLETE, p + 1
            kw = _KEYWORD.match(text, p)
            if kw is None:
                viable = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\s*", text[p:]) is not None
                return undecided if viable or p >= len(text) else (INVALID, p)
            scanner = self.scanner(kw.end(), _ValueScanner)
            status, end = scanner.scan(text)
            if status == PARTIAL:
                return undecided
            ok, value = scanner.value(text, self.json_names) if status == COMPLETE else (False, None)
            if not ok or any(kw.group(1) == k2 for k2, _ in items):
                return INVALID, kw.end()
            items.append((kw.group(1), value))
            if call is None and not final:
                call = CallScan(m.group(), "", False)
                calls.append(call)
            if call is not None:
                call.args = _arguments(items, False)
            p = end + 1 if text[end] == "," else end
