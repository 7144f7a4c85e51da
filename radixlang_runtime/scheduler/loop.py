"""SchedulerLoop: runs the scheduler on a thread and hands each request's progress to its waiter.

Requests come in through a thread-safe inbox; while the scheduler has work it drains the inbox
without blocking (so requests join between any two steps), and blocks on it when idle.

NOTE: the scheduler (model runner included) is *built* on the loop thread too. All torch work of
the process then happens on one thread: on CPU, OpenMP work issued from a second thread after
another thread used the pool runs about 2x slower (measured on small GEMMs here).
The in-process Engine uses this directly; the server's scheduler process will wrap the same loop
with ZeroMQ queues instead of Python ones.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


@dataclass
class ReqUpdate:
    """A snapshot of a request's progress, safe to read on another thread."""

    output_ids: list[int]
    finished_reason: Optional[dict]
    cached_len: int
    error: Optional[str] = None
    # (input logprobs, input top rows, output logprobs, output top rows) when the request asked for them
    logprobs: Optional[tuple[list, list, list, list]] = None


def update_due(req: Req, sent_len: int, stream: bool, stream_interval: int) -> bool:
    """Whether a request's progress goes out now: at the finish, and for a streaming request every
    stream_interval new tokens. Shared by this loop and the server's scheduler process."""
    return req.finished or (stream and len(req.output_ids) - sent_len >= stream_interval)


@dataclass
class _Waiter:
    req: Req
    out: "queue.Queue[ReqUpdate]"
    stream: bool
    sent_len: int = 0


@dataclass
class _Abort:
    rid: str


@dataclass
class _Call:
    fn: Callable[[Scheduler], Any]
    out: "queue.Queue[tuple[bool, Any]]"


class SchedulerLoop:
    def __init__(self, build_scheduler: Callable[[], Scheduler], stream_interval: int = 1):
        """Builds the scheduler on the loop thread; returns once it is built (re-raising a failure)."""
        self.stream_interval = stream_interval
        self._inbox: "queue.Queue[object]" = queue.Queue()
        self._waiters: dict[str, _Waiter] = {}
        self._stop = threading.Event()
        self._built = threading.Event()
        self._build_error: Optional[BaseException] = None
        self.scheduler: Optional[Scheduler] = None
        self._thread = threading.Thread(target=self._main, args=(build_scheduler,), name="radixlang-scheduler",
                                        daemon=True)
        self._thread.start()
        self._built.wait()
        if self._build_error is not None:
            raise self._build_error

    def _main(self, build_scheduler: Callable[[], Scheduler]) -> None:
        try:
            self.scheduler = build_scheduler()
        except BaseException as e:  # handed to the constructing thread
            self._build_error = e
            return
        finally:
            self._built.set()
        self._run()

    # --- producer side (any thread) ---
    def submit(self, req: Req, stream: bool) -> "queue.Queue[ReqUpdate]":
        out: "queue.Queue[ReqUpdate]" = queue.Queue()
        self._inbox.put(_Waiter(req, out, stream))
        return out

    def abort(self, rid: str) -> None:
        self._inbox.put(_Abort(rid))

    def call(self, fn: Callable[[Scheduler], Any], timeout: float = 60.0) -> Any:
        """Run fn(scheduler) on the loop thread between two steps; return its result (or raise its error)."""
        out: "queue.Queue[tuple[bool, Any]]" = queue.Queue()
        self._inbox.put(_Call(fn, out))
        ok, value = out.get(timeout=timeout)
        if not ok:
            raise value
        return value

    def close(self) -> None:
        self._stop.set()
        self._inbox.put(None)
        self._thread.join(timeout=30)

    # --- the loop (scheduler thread) ---
    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain(block=self.scheduler.is_idle)
            if self._stop.is_set():
                break
            try:
                touched = self.scheduler.step()
            except Exception as e:  # never leave a waiter hanging: fail what was in flight
                logger.exception("scheduler step failed")
                for req in self.scheduler.abort_all():
                    self._emit(req, error=f"internal error: {e!r}")
                continue
            for req in touched:
                self._emit(req)

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(item, _Waiter):
                self._waiters[item.req.rid] = item
                self.scheduler.add_request(item.req)
            elif isinstance(item, _Abort):
                self.scheduler.abort(item.rid)
            elif isinstance(item, _Call):
                try:
                    item.out.put((True, item.fn(self.scheduler)))
                except Exception as e:  # handed to the caller
                    item.out.put((False, e))
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _emit(self, req: Req, error: Optional[str] = None) -> None:
        w = self._waiters.get(req.rid)
        if w is None:
            return
        n = len(req.output_ids)
        done = req.finished or error is not None
        if done or update_due(req, w.sent_len, w.stream, self.stream_interval):
            w.sent_len = n
            lp = None
            if req.return_logprob:
                lp = (list(req.input_logprobs), list(req.input_top_logprobs), list(req.output_logprobs),
                      list(req.output_top_logprobs))
            w.out.put(ReqUpdate(list(req.output_ids), req.finished_reason, req.cached_len, error, lp))
        if done:
            del self._waiters[req.rid]
