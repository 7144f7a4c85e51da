"""The expression tree of a program: what `s += ...` queues (SGLang's class names, so code that
imports them keeps working).

Invariants:
- expressions are inert data; only the interpreter (interpreter.py) executes them, only the tracer
  (tracer.py) inspects them without a backend;
- `a + b` of expressions (or of a str and an expression) is a flat `SglExprList`;
- `SglSamplingParams` fields default to None in `gen` (program-level defaults of `run()` apply);
  `resolve()` merges them onto the defaults and `to_runtime_kwargs()` gives the native
  `sampling_params` dict (PROTOCOL.md), so every backend sends the same request shape: exactly the
  fields the server's one intake parses (radixlang_runtime/protocol/sampling_fields.py), the set ones only.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, List, Optional

# The one regex / dtype validator (torch-free: it imports only `re`), shared with the runtime, so the DSL
# accepts exactly the runtime's regex dialect (Rust syntax: `\p{L}` yes, look-around no).
from radixlang_runtime.constrained.regex_check import DTYPE_REGEX, NUMBER_DTYPES, dtype_name
from radixlang_runtime.constrained.regex_check import check_regex as _check_runtime_regex
from radixlang_runtime.protocol.sampling_fields import REQUEST_FIELDS

# SglSamplingParams fields that are not sampling_params: top-level /generate fields (logprob_kwargs) and dtype
# (resolve() turns it into a regex)
_NOT_SAMPLING = frozenset({"return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs",
                           "dtype"})

REGEX_INT, REGEX_FLOAT, REGEX_BOOL, REGEX_STR = (DTYPE_REGEX[k] for k in ("int", "float", "bool", "str"))


@dataclass
class SglSamplingParams:
    max_new_tokens: Optional[int] = 128
    min_new_tokens: Optional[int] = 0
    n: Optional[int] = 1
    stop: Any = ()
    stop_token_ids: Any = ()
    stop_regex: Any = ()
    temperature: Optional[float] = 1.0
    top_p: Optional[float] = 1.0
    top_k: Optional[int] = -1
    min_p: Optional[float] = 0.0
    frequency_penalty: Optional[float] = 0.0
    presence_penalty: Optional[float] = 0.0
    ignore_eos: Optional[bool] = False
    return_logprob: Optional[bool] = None
    logprob_start_len: Optional[int] = None
    top_logprobs_num: Optional[int] = None
    return_text_in_logprobs: Optional[bool] = None
    json_schema: Optional[str] = None
    dtype: Any = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None  # a GBNF-style EBNF grammar (the server's `ebnf`; xgrammar / llguidance backends)

    def clone(self) -> "SglSamplingParams":
        return dataclasses.replace(self, stop=_as_list(self.stop), stop_token_ids=_as_list(self.stop_token_ids),
                                   stop_regex=_as_list(self.stop_regex))

    def resolve(self, overrides: "SglSamplingParams", template_stops: tuple = ()) -> "SglSamplingParams":
        """These defaults with every non-None field of `overrides`; dtype becomes a regex (numbers also
        stop at a space / newline); the chat template's stop strings are always added."""
        out = self.clone()
        for f in dataclasses.fields(self):
            v = getattr(overrides, f.name)
            if v is not None:
                setattr(out, f.name, v)
        out.stop = _as_list(out.stop)
        out.stop_token_ids = _as_list(out.stop_token_ids)
        out.stop_regex = _as_list(out.stop_regex)
        if out.dtype is not None:
            name = dtype_name(out.dtype)
            out.regex = DTYPE_REGEX[name]
            if name in NUMBER_DTYPES:
                out.stop += [x for x in (" ", "\n") if x not in out.stop]
        out.stop += [x for x in template_stops if x not in out.stop]
        return out

    def to_runtime_kwargs(self, **request_wide: Any) -> dict[str, Any]:
        """The native `sampling_params` (SGLang's to_srt_kwargs shape): every set field the server's intake
        parses (REQUEST_FIELDS; None: the server's default), lists as lists; `request_wide` adds fields that
        are not per-gen (skip_special_tokens, ...). The server validates; the DSL only names errors early."""
        out = dict(request_wide)
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in REQUEST_FIELDS and v is not None:
                out[f.name] = list(v) if isinstance(v, (list, tuple)) else v
        return out

    def logprob_kwargs(self) -> dict[str, Any]:
        """The top-level logprob fields of a /generate body that were set."""
        names = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}


def _as_list(v: Any) -> list:
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    return list(v)


def check_regex(regex: Optional[str]) -> None:
    """gen(regex=...) checked as the runtime checks it (regex_check: Rust syntax); ValueError naming the problem."""
    if regex is not None:
        _check_runtime_regex(regex)


def schema_string(json_schema: Any) -> Optional[str]:
    """json_schema travels as a JSON string (PROTOCOL.md): a dict is dumped, a string must parse, a pydantic
    model class gives its model_json_schema() (as SGLang's frontend takes it; pydantic is not imported here)."""
    if json_schema is None:
        return None
    if isinstance(json_schema, type) and callable(getattr(json_schema, "model_json_schema", None)):
        json_schema = json_schema.model_json_schema()
    if isinstance(json_schema, dict):
        return json.dumps(json_schema)
    try:
        json.loads(json_schema)
    except (TypeError, ValueError) as e:
        raise ValueError(f"json_schema must be a JSON string, a dict or a pydantic model class: {e}") from None
    return json_schema


# ---------------------------------------------------------------------------------------- nodes
class SglExpr:
    def __add__(self, other: Any) -> "SglExprList":
        return _concat(self, _as_expr(other))

    def __radd__(self, other: Any) -> "SglExprList":
        return _concat(_as_expr(other), self)


def _as_expr(x: Any) -> SglExpr:
    if isinstance(x, str):
        return SglConstantText(x)
    if isinstance(x, SglExpr):
        return x
    raise TypeError(f"cannot add {type(x).__name__} to a program expression (use str(...))")


def _concat(a: SglExpr, b: SglExpr) -> "SglExprList":
    left = a.expr_list if isinstance(a, SglExprList) else [a]
    right = b.expr_list if isinstance(b, SglExprList) else [b]
    return SglExprList(left + right)


class SglExprList(SglExpr):
    def __init__(self, expr_list: List[SglExpr]):
        self.expr_list = expr_list

    def __repr__(self) -> str:
        return f"ExprList({self.expr_list})"


class SglConstantText(SglExpr):
    def __init__(self, value: str):
        self.value = value

    def __repr__(self) -> str:
        return f"Constant({self.value!r})"


class SglGen(SglExpr):
    def __init__(self, name: Optional[str], sampling_params: SglSamplingParams, tools: Any = None):
        self.name = name
        self.sampling_params = sampling_params
        self.tools = tools  # a radixlang.tools.ToolRequest, or None

    def __repr__(self) -> str:
        return f"Gen({self.name!r})"


class SglSelect(SglExpr):
    def __init__(self, name: Optional[str], choices: List[str], temperature: float, choices_method: Any):
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise ValueError("select needs a non-empty list of non-empty strings")
        if temperature is None or temperature < 0:
            raise ValueError(f"select temperature must be >= 0, got {temperature!r}")
        self.name = name
        self.choices = list(choices)
        self.temperature = temperature
        self.choices_method = choices_method

    def __repr__(self) -> str:
        return f"Select({self.name!r}, choices={self.choices})"


class SglRoleBegin(SglExpr):
    def __init__(self, role: str):
        self.role = role

    def __repr__(self) -> str:
        return f"RoleBegin({self.role})"


class SglRoleEnd(SglExpr):
    def __init__(self, role: str):
        self.role = role

    def __repr__(self) -> str:
        return f"RoleEnd({self.role})"


class SglVarScopeBegin(SglExpr):
    def __init__(self, name: str):
        self.name = name


class SglVarScopeEnd(SglExpr):
    def __init__(self, name: str):
        self.name = name


class SglCommitLazy(SglExpr):
    """Send the text so far as a prefill-only request (it lands in the radix cache)."""


class SglConcateAndAppend(SglExpr):
    def __init__(self, states: list):
        self.states = states


class SglSeparateReasoning(SglExpr):
    """After `expr` ran: each gen / select in it is split by the reasoning parser `model_type` (SGLang's
    --reasoning-parser names): its variable (and the program's text) keeps the answer, and
    `{name}_reasoning_content` gets the reasoning (SGLang's sgl.separate_reasoning)."""

    def __init__(self, model_type: Optional[str], expr: Any):
        self.model_type = model_type
        self.expr = expr
        self.names = [n for n in produced_names(expr) if n is not None]
        if not self.names:
            raise ValueError("separate_reasoning needs a named gen or select (sgl.gen(\"name\", ...))")

    @staticmethod
    def process_name_for_reasoning(name: str) -> str:
        return f"{name}_reasoning_content"

    def __repr__(self) -> str:
        return f"SeparateReasoning({self.model_type!r}, {self.names!r})"


class SglImage(SglExpr):
    def __init__(self, path: Any):
        self.path = path


class SglVideo(SglExpr):
    def __init__(self, path: Any, num_frames: int):
        self.path = path
        self.num_frames = num_frames


class SglArgument(SglExpr):
    """A tracing placeholder for a program argument: any use of its value stops tracing."""

    def __init__(self, name: str):
        self.name = name

    def _stop(self, *args: Any, **kwargs: Any) -> Any:
        from radixlang.tracer import StopTracing

        raise StopTracing(f"argument {self.name!r} is used")

    __str__ = __format__ = __len__ = __getitem__ = __iter__ = __int__ = __float__ = __bool__ = _stop
    __eq__ = __lt__ = __contains__ = __getattr__ = __call__ = _stop
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"Argument({self.name!r})"


def produced_names(expr: Any) -> list[str]:
    """Variable names an expression sets when it runs (what `s[name]` may wait for)."""
    if isinstance(expr, (SglGen, SglSelect)):
        return [expr.name]
    if isinstance(expr, SglVarScopeEnd):
        return [expr.name]
    if isinstance(expr, SglSeparateReasoning):
        return [expr.process_name_for_reasoning(n) for n in expr.names]
    if isinstance(expr, SglExprList):
        return [n for e in expr.expr_list for n in produced_names(e)]
    return []
