"""ForwardThread (torch-free): runs the runner's forward passes on one thread of their own, in the order they
were submitted, so the scheduler's thread can plan the next step while one runs (scheduler/overlap.py).

A step may name futures: (request index, k) pairs whose last extend id, and whose SampleSpec.output_ids' last
entry, is the placeholder `future_token(k)`: the k-th token the step submitted just before it samples. The
thread puts the real ids in before running the step, so the next decode's input comes from the step before
without the scheduler's thread ever waiting for it. A step with futures whose step before failed fails too.

Invariants: one forward at a time, in submission order; every submitted step's `wait` returns its
StepResult or raises its error; a wait never outlives the thread (it polls its liveness); torch's work of
every forward happens on this one thread (OpenMP keeps one pool for it).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from radixlang_runtime.model.executor.step_io import ModelBatch, StepResult

logger = logging.getLogger(__name__)

POLL_S = 1.0  # how often a waiting caller checks that the thread still runs


@dataclass
class Job:
    serial: int
    batch: ModelBatch
    futures: list[tuple[int, int]]  # (request index, k): its placeholder is the step before's k-th token
    future_serial: int  # the serial of the step the futures read (futures: the job just before)
    done: threading.Event = field(default_factory=threading.Event)
    result: Union[StepResult, BaseException, None] = None
    seconds: float = 0.0  # the forward's wall time on the thread


class ForwardThread:
    def __init__(self, forward: Callable[[ModelBatch], StepResult], name: str = "radixlang-forward"):
        self._forward = forward
        self._jobs: "queue.SimpleQueue[Optional[Job]]" = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._started = False
        self._last: Optional[Job] = None  # the job run before (its tokens resolve the next one's futures)

    def submit(self, job: Job) -> Job:
        if not self._started:
            self._thread.start()
            self._started = True
        self._jobs.put(job)
        return job

    def wait(self, job: Job) -> StepResult:
        """job's StepResult (or its error, raised here)."""
        while not job.done.wait(POLL_S):
            if not self._thread.is_alive():
                raise RuntimeError("the forward thread is gone")
        if isinstance(job.result, BaseException):
            raise job.result
        return job.result

    def close(self) -> None:
        if self._started:
            self._jobs.put(None)

    def _main(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            began = time.perf_counter()
            try:
                if job.futures:
                    self._resolve(job)
                job.result = self._forward(job.batch)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting scheduler
                job.result = e
            job.seconds = time.perf_counter() - began
            self._last = job
            job.done.set()

    def _resolve(self, job: Job) -> None:
        last = self._last
        if last is None or last.serial != job.future_serial:
            raise RuntimeError(f"step {job.serial} reads the tokens of step {job.future_serial}, which did not run "
                               "just before it")
        if not isinstance(last.result, StepResult):
            raise RuntimeError(f"step {job.serial} reads the tokens of step {last.serial}, which failed")
        tokens = last.result.next_token_ids
        for i, k in job.futures:
            job.batch.extend_ids[i][-1] = tokens[k]
            spec = job.batch.samples[i]
            if spec is not None:
                spec.output_ids[-1] = tokens[k]
