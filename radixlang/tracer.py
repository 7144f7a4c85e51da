"""Find a program's constant leading text without calling any backend (run_batch pre-caches it).

The body runs once against a TracerState with SglArgument placeholders: constant text and role
markers (rendered through the chat template, default system turn included) accumulate; tracing
stops at the first argument use, generated value, fork, read, or any exception the body raises.
No global tracing state carries data: one ContextVar only marks "a trace is running" so that a
program called from inside a traced body stops the trace instead of running for real.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from radixlang.ir import (SglArgument, SglConstantText, SglExpr, SglExprList, SglRoleBegin, SglRoleEnd)

TRACING: contextvars.ContextVar[bool] = contextvars.ContextVar("radixlang_tracing", default=False)


class StopTracing(Exception):
    pass


class TracerState:
    """Stands in for ProgramState while tracing; only constant text gets through."""

    def __init__(self, chat_template: Any):
        self.chat_template = chat_template
        self.prefix = ""
        self.messages_: list[dict] = []
        self.cur_role: Optional[str] = None

    def __iadd__(self, other: Any) -> "TracerState":
        self._execute(other)
        return self

    def _execute(self, x: Any) -> None:
        if isinstance(x, str):
            self.prefix += x
        elif isinstance(x, SglConstantText):
            self.prefix += x.value
        elif isinstance(x, SglExprList):
            for e in x.expr_list:
                self._execute(e)
        elif isinstance(x, SglRoleBegin):
            self._role_begin(x.role)
        elif isinstance(x, SglRoleEnd):
            self._role_end(x.role)
        else:  # gen, select, arguments, var scopes, images...: the constant part ends here
            raise StopTracing(repr(x))

    def _role_begin(self, role: str) -> None:
        if self.cur_role is not None:
            raise StopTracing("nested role")
        default_system = self.chat_template.default_system_prompt
        if not self.messages_ and role != "system" and default_system:
            self._role_begin("system")
            self.prefix += default_system
            self._role_end("system")
        self.cur_role = role
        self.prefix += self.chat_template.get_prefix_and_suffix(role, self.messages_)[0]

    def _role_end(self, role: str) -> None:
        self.prefix += self.chat_template.get_prefix_and_suffix(role, self.messages_)[1]
        self.messages_.append({"role": role, "content": ""})  # content unknown: only its presence matters
        self.cur_role = None

    def _role(self, name: str, expr: Any = None) -> Any:
        if expr is not None:
            self._execute(SglExprList([SglRoleBegin(name), expr if isinstance(expr, SglExpr) else str(expr),
                                       SglRoleEnd(name)]))
            return None

        @contextmanager
        def scope() -> Iterator[None]:
            self._execute(SglRoleBegin(name))
            yield
            self._execute(SglRoleEnd(name))

        return scope()

    def system(self, expr: Any = None) -> Any:
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)

    def _stop(self, *args: Any, **kwargs: Any) -> Any:
        raise StopTracing("the program reads state")

    fork = copy = var_scope = text = messages = get_var = set_var = get_meta_info = sync = error = _stop
    __getitem__ = __setitem__ = __contains__ = _stop


def extract_prefix_by_tracing(program: Any, backend: Any) -> str:
    """The constant text every run of `program` starts with ("" when there is none)."""
    state = TracerState(backend.get_chat_template())
    args = {name: SglArgument(name) for name in program.arg_names}
    args.update(program.bind_arguments)
    token = TRACING.set(True)
    try:
        program.func(state, **args)
    except Exception:  # StopTracing, or the body tripping over a placeholder: the prefix so far stands
        pass
    finally:
        TRACING.reset(token)
    return state.prefix


def check_not_tracing() -> None:
    if TRACING.get():
        raise StopTracing("a program called inside a traced program")
