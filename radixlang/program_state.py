"""ProgramState (what a program body's `s` is and what `run()` returns) and ProgramStateGroup (forks).

Invariants:
- `s += x` only queues; reads (`s[v]`, `text()`, `messages()`, `error()`) wait, bounded (interpreter.py);
- `join()` waits for every child; "gather_variable" copies the children's new variables into the
  parent as lists in child order, "concate_and_append" appends their texts to the parent; a failed
  child fails the parent (its later items are skipped, `error()` returns the cause);
- streaming iterators yield what arrived since the previous yield and end when the state (or the
  variable) is done; per-chunk meta_info (logprob deltas) is kept in arrival order.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import Any, AsyncIterator, Iterator, List, Optional

from radixlang.interpreter import StreamExecutor
from radixlang.ir import (SglConcateAndAppend, SglExpr, SglExprList, SglRoleBegin, SglRoleEnd, SglVarScopeBegin,
                          SglVarScopeEnd)

_DELTA_KEYS = ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")


class ProgramState:
    def __init__(self, stream_executor: StreamExecutor):
        self.stream_executor = stream_executor
        self.ret_value: Any = None

    # ------------------------------------------------------------------ building
    def _role(self, name: str, expr: Optional[SglExpr] = None) -> Any:
        if expr is not None:
            role_expr = SglExprList([SglRoleBegin(name), expr if isinstance(expr, SglExpr) else _text(expr),
                                     SglRoleEnd(name)])
            self.stream_executor.submit(role_expr)
            return role_expr

        @contextmanager
        def scope() -> Iterator[None]:
            self.stream_executor.submit(SglRoleBegin(name))
            yield
            self.stream_executor.submit(SglRoleEnd(name))

        return scope()

    def system(self, expr: Any = None) -> Any:
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        self.stream_executor.submit(SglVarScopeBegin(name))
        yield
        self.stream_executor.submit(SglVarScopeEnd(name))

    def fork(self, size: int = 1, position_ids_offset: Optional[List[int]] = None) -> "ProgramStateGroup":
        return ProgramStateGroup([ProgramState(x) for x in self.stream_executor.fork(size)], self)

    @contextmanager
    def copy(self, position_ids_offset: Optional[List[int]] = None) -> Iterator["ProgramState"]:
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    def __iadd__(self, other: Any) -> "ProgramState":
        self.stream_executor.submit(other)
        return self

    # ------------------------------------------------------------------ reading
    def text(self) -> str:
        return self.stream_executor.text()

    def messages(self) -> list[dict]:
        return self.stream_executor.messages()

    def sync(self) -> None:
        self.stream_executor.sync()

    def error(self) -> Optional[BaseException]:
        return self.stream_executor.error()

    def get_var(self, name: Any) -> Any:
        return self.stream_executor.get_var(name)

    def set_var(self, name: Any, value: Any) -> None:
        self.stream_executor.set_var(name, value)

    def get_meta_info(self, name: Any) -> Any:
        return self.stream_executor.get_meta_info(name)

    def tool_calls(self, name: Any) -> list:
        """Every call (radixlang.tools.ToolCall) the gen `name` with tools= wrote, in order."""
        self.get_var(name)
        return self.stream_executor.get_var(f"{name}_tool_calls")

    def __getitem__(self, name: Any) -> Any:
        return self.get_var(name)

    def __setitem__(self, name: Any, value: Any) -> None:
        self.set_var(name, value)

    def __contains__(self, name: Any) -> bool:
        return name in self.stream_executor.variables

    def __del__(self) -> None:  # may run on any thread, at interpreter exit too: only signals, never waits
        exe = self.__dict__.get("stream_executor")
        if exe is not None:
            exe.end(wait=False)

    def __repr__(self) -> str:  # never waits: a repr must not hang on a failed or running state
        exe = self.stream_executor
        status = "failed" if exe.error_ is not None else ("done" if exe.is_finished else "running")
        return f"ProgramState({status}, {exe.text_!r})"

    # ------------------------------------------------------------------ streaming
    def _var_done(self, name: Any) -> bool:
        exe = self.stream_executor
        with exe.cond:
            return not exe.is_pending(name) and (name in exe.stream_chunks or name in exe.variables
                                                 or name in exe.lost or exe.is_finished)

    def _chunks(self, var_name: Any, return_meta: bool) -> Iterator[Any]:
        """Yields for each wake-up: the text since the previous one (or (text, meta) chunks)."""
        exe = self.stream_executor
        version, prev, used, pending_meta = -1, 0, 0, None
        while True:
            version, finished = exe.wait_change(version)
            done = finished if var_name is None else self._var_done(var_name)
            if var_name is None or var_name not in exe.stream_chunks:  # whole text, or a non-streamed var
                source = exe.text_ if var_name is None else (exe.variables.get(var_name) if done else None)
                out = source[prev:] if isinstance(source, str) else ""
                prev += len(out)
                if out:
                    yield (out, exe.meta_info.get(var_name)) if return_meta else out
            else:
                with exe.cond:
                    chunks = list(exe.stream_chunks.get(var_name, ()))[used:]
                used += len(chunks)
                if not return_meta:
                    out = "".join(c for c, _ in chunks)
                    if out:
                        yield out
                for delta, meta in chunks if return_meta else ():
                    pending_meta = _merge_meta(pending_meta, meta)
                    if delta:
                        yield delta, pending_meta
                        pending_meta = None
            if done:
                return

    def text_iter(self, var_name: Optional[str] = None) -> Iterator[str]:
        if not self.stream_executor.stream:
            yield self.text() if var_name is None else self.get_var(var_name)
            return
        yield from self._chunks(var_name, False)

    async def text_async_iter(self, var_name: Optional[str] = None,
                              return_meta_data: bool = False) -> AsyncIterator[Any]:
        if not self.stream_executor.stream:
            loop = asyncio.get_running_loop()
            if var_name is None:
                yield await loop.run_in_executor(None, self.text)
            else:
                value = await loop.run_in_executor(None, self.get_var, var_name)
                yield (value, self.get_meta_info(var_name)) if return_meta_data else value
            return
        it = self._chunks(var_name, return_meta_data and var_name is not None)
        loop = asyncio.get_running_loop()
        sentinel = object()
        while True:
            item = await loop.run_in_executor(None, next, it, sentinel)
            if item is sentinel:
                return
            yield item


def _text(x: Any) -> Any:
    return x if isinstance(x, str) else str(x)


def _merge_meta(pending: Optional[dict], meta: Any) -> Any:
    """Chunks without text pass their logprob deltas on to the next chunk with text."""
    if pending is None or not isinstance(meta, dict):
        return meta
    merged = dict(meta)
    for k in _DELTA_KEYS:
        if k in meta or k in pending:
            merged[k] = list(pending.get(k, [])) + list(meta.get(k, []))
    return merged


class ProgramStateGroup:
    def __init__(self, states: List[ProgramState], src_state: Optional[ProgramState] = None):
        self.states = states
        self.src_state = src_state

    def join(self, mode: str = "gather_variable") -> None:
        src = self.src_state.stream_executor
        if mode == "gather_variable":
            before = set(src.variables)
            for st in self.states:
                exe = st.stream_executor
                exe.sync()
                if exe.error_ is not None and src.error_ is None:
                    src.fail(exe.error_)
                for k in set(exe.variables) - before:
                    src.variables.setdefault(k, []).append(exe.variables[k])
        elif mode == "concate_and_append":
            self.src_state += SglConcateAndAppend(self.states)
            src.sync()
        else:
            raise ValueError(f"invalid join mode {mode!r}: use 'gather_variable' or 'concate_and_append'")
        for st in self.states:
            st.stream_executor.end()

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        if self.states[i] is not value:
            raise ValueError("forks[i] can only be extended in place (forks[i] += ...)")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> "ProgramStateGroup":
        if isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"got {len(other)} items for {len(self.states)} forks")
            for st, x in zip(self.states, other):
                st += x
        elif isinstance(other, (str, SglExpr)):
            for st in self.states:
                st += other
        elif callable(other):
            for i, st in enumerate(self.states):
                st += other(i)
        else:
            raise ValueError(f"cannot add {type(other).__name__} to forks")
        return self
