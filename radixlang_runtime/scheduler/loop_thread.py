"""ThreadedLoop: the in-process Engine's side of RequestLoop — the loop on its own thread, Python queues.

NOTE: the scheduler (model runner included) is *built* on the loop thread too. All torch work of
the process then happens on one thread (the overlap schedule's forward passes: on its forward thread, always
that one): on CPU, OpenMP work issued from a second thread after
another thread used the pool runs much slower (docs/PERFORMANCE.md#threads).

Invariants:
- every submitted request's queue receives ("tokens", BatchTokenIDOut with its one record) items and
  ends with a finished record or one ("error", message) item;
- if the loop thread dies (a bug below RequestLoop's containment), every waiter gets an error item
  and every later call raises RuntimeError at once: `get` never waits on a dead loop.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Optional

from radixlang_runtime.protocol.messages import BatchTokenIDOut, TokenizedGenerateReq
from radixlang_runtime.scheduler.loop import Call, RequestLoop
from radixlang_runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)

Item = tuple[str, Any]  # ("tokens", BatchTokenIDOut) | ("error", (status, message))


class QueueIO:
    """LoopIO over Python queues: one inbox, one result queue per request."""

    def __init__(self) -> None:
        self.inbox: "queue.Queue[Any]" = queue.Queue()
        self.waiters: dict[str, "queue.Queue[Item]"] = {}
        self.lock = threading.Lock()

    def receive(self, timeout: float) -> list[Any]:
        msgs = []
        try:
            msgs.append(self.inbox.get(timeout=timeout) if timeout > 0 else self.inbox.get_nowait())
            while True:
                msgs.append(self.inbox.get_nowait())
        except queue.Empty:
            return msgs

    def send_tokens(self, out: BatchTokenIDOut) -> None:
        for rec in out.reqs:
            with self.lock:
                q = self.waiters.get(rec.rid)
                if rec.progress.finished_reason is not None:
                    self.waiters.pop(rec.rid, None)
            if q is not None:
                q.put(("tokens", BatchTokenIDOut([rec])))

    def send_error(self, rids: list[str], message: str, status: int = 500) -> None:
        for rid in rids:
            with self.lock:
                q = self.waiters.pop(rid, None)
            if q is not None:
                q.put(("error", (status, message)))

    def send_control(self, msg: Any) -> None:  # the Engine uses Call, not control messages
        logger.warning("unexpected control reply %s", type(msg).__name__)

    def fail_all(self, message: str) -> None:
        with self.lock:
            waiters, self.waiters = self.waiters, {}
        for q in waiters.values():
            q.put(("error", (500, message)))


class ThreadedLoop:
    POLL = 1.0  # seconds between liveness checks of a waiting caller

    def __init__(self, build_scheduler: Callable[[], Scheduler], stream_interval: int = 1,
                 stats: Optional[Callable[[Scheduler], dict]] = None, build_timeout: float = 600.0):
        """Builds the scheduler on the loop thread; returns once it is built (re-raising a failure)."""
        self.io = QueueIO()
        self.scheduler: Optional[Scheduler] = None
        self.dead: Optional[str] = None
        self._stop = threading.Event()
        self._built = threading.Event()
        self._build_error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._main, args=(build_scheduler, stream_interval, stats),
                                        name="radixlang-scheduler", daemon=True)
        self._thread.start()
        if not self._built.wait(build_timeout):
            raise RuntimeError(f"building the scheduler took longer than {build_timeout:.0f} s")
        if self._build_error is not None:
            raise self._build_error

    def _main(self, build: Callable[[], Scheduler], stream_interval: int, stats) -> None:
        try:
            self.scheduler = build()
        except BaseException as e:  # handed to the constructing thread
            self._build_error = e
            return
        finally:
            self._built.set()
        try:
            RequestLoop(self.scheduler, self.io, stream_interval, stats).run(self._stop.is_set)
        except BaseException as e:  # noqa: BLE001 - never leave a waiter behind
            logger.exception("scheduler loop died")
            self.dead = f"scheduler loop died: {type(e).__name__}: {e}"
        else:
            self.dead = "the engine was shut down"
        self.io.fail_all(self.dead)

    # --- callers (any thread) ---
    def submit(self, msg: TokenizedGenerateReq) -> "queue.Queue[Item]":
        self._check_alive()
        q: "queue.Queue[Item]" = queue.Queue()
        with self.io.lock:
            self.io.waiters[msg.rid] = q
        self.io.inbox.put(msg)
        return q

    def get(self, q: "queue.Queue[Item]") -> Item:
        """The next item of a request's queue; an ("error", ...) item if the loop dies meanwhile."""
        while True:
            try:
                return q.get(timeout=self.POLL)
            except queue.Empty:
                if self.dead is not None or not self._thread.is_alive():
                    return "error", (500, self.dead or "scheduler loop died")

    def put(self, msg: Any) -> None:
        self.io.inbox.put(msg)

    def call(self, fn: Callable[[Scheduler], Any], timeout: float = 60.0) -> Any:
        """Run fn(scheduler) on the loop thread between two steps; return its result (or raise its error)."""
        self._check_alive()
        out: "queue.Queue[tuple[bool, Any]]" = queue.Queue()
        self.io.inbox.put(Call(fn, lambda ok, v: out.put((ok, v))))
        waited = 0.0
        while True:
            try:
                ok, value = out.get(timeout=self.POLL)
                break
            except queue.Empty:
                waited += self.POLL
                self._check_alive()
                if waited >= timeout:
                    raise TimeoutError(f"the scheduler did not answer within {timeout:.0f} s")
        if not ok:
            raise value
        return value

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise RuntimeError(self.dead)

    def close(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self.io.inbox.put(Call(lambda _: None, lambda ok, v: None))  # wakes an idle loop's wait for messages
        self._thread.join(timeout=timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()
