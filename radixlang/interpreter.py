"""StreamExecutor: one program state's worker thread and its FIFO of queued expressions.

Invariants:
- `submit` only queues (the body never blocks on the model); one worker executes items in order and
  is the only writer of text_, messages_ and generated variables;
- every change bumps `version` under `cond` and notifies, so readers wait on one condition;
- the names a queued item will set are counted in `pending`: `get_var(v)` waits while v is pending,
  returns at once when it is set, and raises at once when nothing queued will ever set it;
- the first failing item's exception is kept in `error_`; queued and later items are skipped and
  their variables are `lost` (reading one raises ProgramError); text() returns what exists;
- every wait is bounded by `global_config.wait_timeout` (TimeoutError past it), taking `cond` included;
- the worker is a daemon thread: nothing at interpreter exit waits for it. `end(wait=False)` (what
  `ProgramState.__del__` calls) never blocks: the garbage collector runs it on any thread, at exit
  too, when a worker the exit froze can hold `cond` forever; with `cond` held elsewhere it sets
  `_ended` alone and the worker's idle poll sees it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, deque
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from radixlang.errors import ProgramError
from radixlang.global_config import global_config
from radixlang.images import image_data
from radixlang.ir import (SglCommitLazy, SglConcateAndAppend, SglConstantText, SglExpr, SglExprList, SglGen,
                          SglImage, SglRoleBegin, SglRoleEnd, SglSamplingParams, SglSelect, SglSeparateReasoning,
                          SglVarScopeBegin, SglVarScopeEnd, SglVideo, produced_names)

_IDLE_POLL_S = 0.5  # the idle worker re-checks `_ended` this often (end(wait=False) may not notify)


class StreamExecutor:
    def __init__(self, backend: Any, arguments: dict, default_params: SglSamplingParams,
                 chat_template: Any = None, stream: bool = False):
        self.sid = uuid.uuid4().hex
        self.backend = backend
        self.arguments = arguments
        self.default_params = default_params
        self.stream = stream
        self.chat_template = chat_template or backend.get_chat_template()
        self.text_ = ""
        self.images_: list[str] = []  # the images of text_'s placeholders, in order (radixlang/images.py)
        self.messages_: list[dict] = []
        self.variables: dict[Any, Any] = {}
        self.meta_info: dict[Any, Any] = {}
        self.stream_chunks: dict[Any, list[tuple[str, Any]]] = {}  # streamed gens: (text delta, meta) per chunk
        self.cur_role: Optional[str] = None
        self.cur_role_begin_pos: Optional[int] = None
        self.fork_start_text_pos: Optional[int] = None
        self.error_: Optional[BaseException] = None
        self.lost: set = set()
        self.cond = threading.Condition()
        self.version = 0
        self.is_finished = False
        self._items: deque = deque()
        self._pending: Counter = Counter()
        self._running = False
        self._ended = False
        self._scope_starts: dict[str, int] = {}
        self._worker: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ queue side (any thread)
    def submit(self, expr: Any) -> None:
        if expr is None:
            raise ValueError("tried to append None to a program state")
        if not isinstance(expr, (str, SglExpr)):
            raise TypeError(f"cannot append {type(expr).__name__} to a program state (use str(...))")
        with self.cond:
            if self._ended:
                raise RuntimeError("this program state has ended; it takes no more expressions")
            names = produced_names(expr)
            if self.error_ is None:
                self._pending.update(names)
                self._items.append(expr)
            else:
                self.lost.update(names)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, daemon=True, name=f"radixlang-{self.sid[:8]}")
                self._worker.start()
            self._bump()

    def end(self, wait: bool = True) -> None:
        """No more items will come; the worker exits once the queue is empty (end never waits for it).

        wait=True takes `cond` within wait_timeout (TimeoutError past it); wait=False only tries it:
        when another thread holds it, `_ended` is set alone (a plain attribute write) and the lock's
        holder or the worker's idle poll (every _IDLE_POLL_S) sees it."""
        if wait:
            with self._hold(global_config.wait_timeout, "lock to end the state"):
                self._mark_ended()
        elif self.cond.acquire(blocking=False):
            try:
                self._mark_ended()
            finally:
                self.cond.release()
        else:
            self._ended = True

    def _mark_ended(self) -> None:  # under cond
        self._ended = True
        if self._worker is None:
            self.is_finished = True
        self._bump()

    def fail(self, error: BaseException) -> None:
        with self.cond:
            if self.error_ is None:
                self.error_ = error
            self.lost.update(n for n, c in self._pending.items() if c > 0)
            self._pending.clear()
            self._items.clear()
            self._bump()

    def _bump(self) -> None:
        self.version += 1
        self.cond.notify_all()

    # ------------------------------------------------------------------ waiting (any thread)
    @contextmanager
    def _hold(self, limit: float, what: str) -> Iterator[None]:
        """`with self.cond`, bounded: a thread frozen at interpreter exit may never release it."""
        if not self.cond.acquire(timeout=max(limit, 0.0)):
            raise TimeoutError(f"program state: no {what} after {limit:g} s")
        try:
            yield
        finally:
            self.cond.release()

    def wait_until(self, pred: Callable[[], bool], what: str, timeout: Optional[float] = None) -> None:
        limit = global_config.wait_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        with self._hold(limit, what):
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"program state: no {what} after {limit:.0f} s")
                self.cond.wait(min(left, 1.0))

    def wait_change(self, seen_version: int) -> tuple[int, bool]:
        """Block until something changed since `seen_version` (or the state finished)."""
        self.wait_until(lambda: self.version != seen_version or self.is_finished, "progress")
        with self.cond:
            return self.version, self.is_finished

    def sync(self) -> None:
        self.wait_until(lambda: not self._items and not self._running, "end of the queued work")

    def is_pending(self, name: Any) -> bool:
        with self.cond:
            return self._pending[name] > 0

    def get_var(self, name: Any) -> Any:
        self.wait_until(lambda: self._pending[name] <= 0, f"value for variable {name!r}")
        with self._hold(global_config.wait_timeout, f"value for variable {name!r}"):
            if name in self.lost:
                raise ProgramError(f"variable {name!r} will never be set: the program failed: "
                                   f"{self.error_!r}") from self.error_
            if name in self.variables:
                return self.variables[name]
            coming = [n for n, c in self._pending.items() if c > 0]
            known = _names(n for n in self.variables if n not in coming)  # a streamed gen's partial text is coming
            coming = _names(coming)
        raise KeyError(f"variable {name!r} is not set and nothing queued sets it; "
                       + (f"the variables are: {known}" if known else "no variable is set yet")
                       + (f" (still to come: {coming})" if coming else ""))

    def set_var(self, name: Any, value: Any) -> None:
        with self.cond:
            self.variables[name] = value
            self.lost.discard(name)
            self._bump()

    def get_meta_info(self, name: Any) -> Any:
        self.wait_until(lambda: self._pending[name] <= 0, f"meta_info for {name!r}")
        return self.meta_info.get(name)

    def text(self) -> str:
        self.sync()
        return self.text_

    def messages(self) -> list[dict]:
        self.sync()
        return self.messages_

    def error(self) -> Optional[BaseException]:
        self.sync()
        return self.error_

    # ------------------------------------------------------------------ fork
    def fork(self, size: int) -> list["StreamExecutor"]:
        """Children copying text, variables, messages and role; the prompt is committed once first."""
        size = int(size)
        if size < 1:
            raise ValueError(f"fork size must be >= 1, got {size}")
        if size > 1:
            self.submit(SglCommitLazy())
        self.sync()
        children = []
        for _ in range(size):
            c = StreamExecutor(self.backend, self.arguments, self.default_params, self.chat_template, self.stream)
            c.variables = dict(self.variables)
            c.meta_info = dict(self.meta_info)
            c.text_ = self.text_
            c.images_ = list(self.images_)
            c.messages_ = list(self.messages_)
            c.cur_role, c.cur_role_begin_pos = self.cur_role, self.cur_role_begin_pos
            c.fork_start_text_pos = len(self.text_)
            c.error_, c.lost = self.error_, set(self.lost)
            children.append(c)
        return children

    # ------------------------------------------------------------------ worker
    def _work(self) -> None:
        while True:
            with self.cond:
                while not self._items and not self._ended:
                    self.cond.wait(_IDLE_POLL_S)
                if not self._items:
                    self.is_finished = True
                    self._bump()
                    return
                expr = self._items.popleft()
                self._running = True
            try:
                self._execute(expr)
            except BaseException as e:  # kept, never raised in the worker: readers see it
                self.fail(e)
            finally:
                with self.cond:
                    self._running = False
                    self._pending.subtract(produced_names(expr))
                    self._pending += Counter()  # drop zero / negative counts
                    self._bump()

    def _update(self, text: str = "", variables: Optional[dict] = None) -> None:
        with self.cond:
            self.text_ += text
            self.variables.update(variables or {})
            self._bump()

    def _execute(self, x: Any) -> None:
        if isinstance(x, str):
            self._fill(x)
        elif isinstance(x, SglConstantText):
            self._fill(x.value)
        elif isinstance(x, SglExprList):
            for e in x.expr_list:
                self._execute(e)
        elif isinstance(x, SglGen):
            self._gen(x)
        elif isinstance(x, SglSelect):
            self._select(x)
        elif isinstance(x, SglRoleBegin):
            self._role_begin(x.role)
        elif isinstance(x, SglRoleEnd):
            self._role_end(x.role)
        elif isinstance(x, SglVarScopeBegin):
            self._scope_starts[x.name] = len(self.text_)
        elif isinstance(x, SglVarScopeEnd):
            start = self._scope_starts.pop(x.name, len(self.text_))
            self._update("", {x.name: self.text_[start:]})
        elif isinstance(x, SglCommitLazy):
            if self.text_:
                self.backend.cache_prefix(self.text_, self.images_)
        elif isinstance(x, SglConcateAndAppend):
            self._concate_and_append(x.states)
        elif isinstance(x, SglSeparateReasoning):
            self._separate_reasoning(x)
        elif isinstance(x, SglImage):
            token = self.backend.image_token()
            if token is None:
                raise ValueError(f"{self.backend.get_model_name()} is a text-only model: sgl.image inputs are not "
                                 "supported")
            self.images_.append(image_data(x.path))
            self._fill(token)
        elif isinstance(x, SglVideo):
            raise ValueError(f"sgl.video inputs are not supported ({self.backend.get_model_name()})")
        else:
            raise TypeError(f"unknown expression {x!r}")

    def _fill(self, value: Any) -> None:
        self._update(str(value))

    def _gen(self, expr: SglGen) -> None:
        params = self.default_params.resolve(expr.sampling_params, tuple(self.chat_template.stop_str))
        name = expr.name
        if expr.tools is not None:
            self._gen_tools(expr, params)
            return
        if not self.stream:
            comp, meta = self.backend.generate(self.text_, params, self.images_)
            with self.cond:
                self.meta_info[name] = meta
            self._update(comp[0] if isinstance(comp, list) else comp, {name: comp})
            return
        if params.n not in (None, 1):
            raise ValueError("streaming supports n=1 only")
        with self.cond:
            self.variables[name] = ""
            self.stream_chunks[name] = []
        for delta, meta in self.backend.generate_stream(self.text_, params, self.images_):
            with self.cond:
                self.meta_info[name] = meta
                self.stream_chunks[name].append((delta, meta))
            self._update(delta, {name: self.variables[name] + delta})

    def _gen_tools(self, expr: SglGen, params: Any) -> None:
        """A gen with tools (radixlang/tools.py): the messages so far rendered with the tools by the model's
        Jinja template are its prompt; the variable gets the first call (or the text), `{name}_tool_calls`
        every call."""
        if self.cur_role != "assistant":
            raise ValueError("gen(tools=...) must be inside sgl.assistant(...): the tools are rendered into a chat")
        if self.stream or params.n not in (None, 1):
            raise ValueError("gen(tools=...) supports neither stream=True nor n > 1")
        req, name = expr.tools, expr.name
        info = getattr(self.backend, "model_info", None) or {}
        prompt, parser, list_form = req.render(info.get("chat_template"), self.messages_)
        prompt += self.text_[self.cur_role_begin_pos:]  # what the assistant turn holds already
        params.regex = req.forced_regex(parser, list_form)
        comp, meta = self.backend.generate(prompt, params, self.images_)
        calls, content = req.read(comp, parser)
        with self.cond:
            self.meta_info[name] = meta
        self._update(comp, {name: calls[0] if calls else content, f"{name}_tool_calls": calls})

    def _select(self, expr: SglSelect) -> None:
        d = self.backend.select(self.text_, expr.choices, expr.temperature, expr.choices_method, self.images_)
        if expr.name is not None:
            with self.cond:
                self.meta_info[expr.name] = d.meta_info
            self._update(d.decision, {expr.name: d.decision})
        else:
            self._update(d.decision)

    def _separate_reasoning(self, x: SglSeparateReasoning) -> None:
        """Split each named output of x.expr (just run) with the runtime's torch-free reasoning parser: the
        variable and its text in the program keep the answer, `{name}_reasoning_content` the reasoning."""
        from radixlang_runtime.reasoning_parser import get_reasoning_parser

        if x.model_type is None:
            raise ValueError("separate_reasoning needs model_type= (a --reasoning-parser name: deepseek-r1, qwen3)")
        parser = get_reasoning_parser(x.model_type)
        for name in x.names:
            value = self.variables.get(name)
            splits = [parser.parse(v) for v in value] if isinstance(value, list) else [parser.parse(value or "")]
            content = [sp.content for sp in splits] if isinstance(value, list) else splits[0].content
            reasoning = [sp.reasoning for sp in splits] if isinstance(value, list) else splits[0].reasoning
            shown, kept = (value[0], content[0]) if isinstance(value, list) else (value or "", content)
            with self.cond:
                at = self.text_.rfind(shown) if shown else -1
                if at >= 0:  # the output as the program's text shows it (the first of n)
                    self.text_ = self.text_[:at] + kept + self.text_[at + len(shown):]
                self.variables[name] = content
                self.variables[x.process_name_for_reasoning(name)] = reasoning
                self._bump()

    def _role_begin(self, role: str) -> None:
        if self.cur_role is not None:
            raise ValueError(f"nested roles are not allowed: {role} inside {self.cur_role}")
        default_system = self.chat_template.default_system_prompt
        if not self.messages_ and role != "system" and default_system:
            self._role_begin("system")
            self._fill(default_system)
            self._role_end("system")
        self.cur_role = role
        prefix, _ = self.chat_template.get_prefix_and_suffix(role, self.messages_)
        self._fill(prefix)
        self.cur_role_begin_pos = len(self.text_)

    def _role_end(self, role: str) -> None:
        if self.cur_role != role:
            raise ValueError(f"{role}_end without a matching {role}_begin (current role: {self.cur_role})")
        content = self.text_[self.cur_role_begin_pos:].lstrip()
        self.cur_role = None
        _, suffix = self.chat_template.get_prefix_and_suffix(role, self.messages_)
        self._fill(suffix)
        with self.cond:
            self.messages_.append({"role": role, "content": content})

    def _concate_and_append(self, states: list) -> None:
        new_text = ""
        for st in states:
            exe = st.stream_executor
            exe.sync()
            if exe.error_ is not None:
                raise ProgramError(f"a forked state failed: {exe.error_!r}") from exe.error_
            new_text += exe.text_[exe.fork_start_text_pos:]
        self._fill(new_text)
        if global_config.enable_parallel_encoding and getattr(self.backend, "support_concate_and_append", False):
            self.backend.concatenate_and_append([st.stream_executor.sid for st in states], self.sid)


def _names(names: Any, most: int = 20) -> str:
    """'a', 'b', ... for a message: the first `most` names in order, then how many more."""
    names = list(names)
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f", ... ({len(names) - most} more)" if len(names) > most else "")
