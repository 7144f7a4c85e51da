"""CompileWorker: one compile child process (worker_child.py), one job at a time. Torch-free.

compile() blocks its caller (a GrammarCompiler thread, never the scheduler) for at most
limits.timeout_s: past it the child is killed (SIGKILL) and the job fails with "grammar too large:
compile exceeded N s". A child that dies (Rust aborts when RLIMIT_AS refuses an allocation) fails
the job with the memory message. Either way the next job starts a fresh child; the vocabulary is sent
once per child (a ~1 MB frame).

Invariants: at most one job in the child at a time; every wait has a deadline; a child that could be
in an unknown state (timeout, crash, memory error, broken pipe) is killed before the next job; the
child dies with this process (child_process.py: PR_SET_PDEATHSIG follows the thread that starts it,
which is the worker's own GrammarCompiler thread, alive until close() has killed the child).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

from radixlang_runtime.constrained.framing import FrameReader, write_frame
from radixlang_runtime.constrained.vocab import TokenVocab

_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class WorkerLimits:
    timeout_s: float = 20.0  # per compile
    memory_bytes: int = 2 << 30  # RLIMIT_AS of the child; 0 = none
    start_timeout_s: float = 60.0  # spawn + vocabulary load
    backend: str = "outlines"  # backends.py: the library the child compiles with

    def __post_init__(self) -> None:
        assert self.timeout_s > 0 and self.start_timeout_s > 0 and self.memory_bytes >= 0

    def memory_text(self) -> str:
        return f"{self.memory_bytes / (1 << 30):g} GiB"


@dataclass
class CompileResult:
    ok: bool
    index: bytes = b""  # the pickled Index
    seconds: float = 0.0  # compile time in the child (disk read time when from_disk)
    from_disk: bool = False
    error: str = ""


def vocab_message(vocab: TokenVocab) -> dict[str, Any]:
    return {"op": "vocab", "tid": vocab.tokenizer_id, "eos": vocab.eos_token_id, "sentinel": vocab.sentinel,
            "tokens": [[b, ids] for b, ids in vocab.byte_map().items()]}


class _ChildGone(Exception):
    pass


class CompileWorker:
    def __init__(self, vocab_msg: dict[str, Any], limits: WorkerLimits):
        self.vocab_msg = vocab_msg
        self.limits = limits
        self.proc: Optional[subprocess.Popen] = None
        self._reader = FrameReader()
        self._pending: list[dict[str, Any]] = []
        self.restarts = 0  # children killed or lost (timeouts, crashes)

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self) -> None:
        """Spawn the child and load the vocabulary (bounded by start_timeout_s). Raises RuntimeError."""
        if self.pid is not None:
            return
        env = dict(os.environ)
        env["PYTHONPATH"] = _PKG_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "radixlang_runtime.constrained.worker_child", str(self.limits.memory_bytes),
             str(os.getpid()), self.limits.backend],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self._reader, self._pending = FrameReader(), []
        try:
            self._send(self.vocab_msg)
            reply = self._wait_reply(time.monotonic() + self.limits.start_timeout_s)
        except _ChildGone:
            reply = None
        if reply is None or not reply.get("ok"):
            self.kill()
            raise RuntimeError("grammar compiler process failed to start")

    def compile(self, kind: str, text: str, disk: Optional[str] = None, job: int = 0) -> CompileResult:
        try:
            self.start()
        except RuntimeError as e:
            return CompileResult(False, error=str(e))
        t0 = time.monotonic()
        try:
            self._send({"op": "compile", "job": job, "tid": self.vocab_msg["tid"], "kind": kind,
                        "text": text, "disk": disk})
            reply = self._wait_reply(t0 + self.limits.timeout_s)
        except _ChildGone:
            return CompileResult(False, error=self._death_message())
        if reply is None:
            self.kill()
            return CompileResult(False, error=f"grammar too large: compile exceeded {self.limits.timeout_s:g} s")
        if reply.get("ok"):
            return CompileResult(True, reply["index"], reply["seconds"], reply.get("from_disk", False))
        if reply.get("error") == "memory":
            self.kill()
            return CompileResult(False, error=f"grammar too large: compile exceeded {self.limits.memory_text()} "
                                              "of memory")
        return CompileResult(False, error=reply.get("error", "compile failed"))

    def kill(self) -> None:
        """SIGKILL the child (if any) and reap it (bounded)."""
        p, self.proc = self.proc, None
        if p is None:
            return
        self.restarts += 1
        if p.poll() is None:
            p.kill()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for f in (p.stdin, p.stdout):
            try:
                f.close()
            except OSError:
                pass

    # ------------------------------------------------------------------ pipe
    def _send(self, msg: dict[str, Any]) -> None:
        p = self.proc
        if p is None or p.stdin is None:
            raise _ChildGone()
        try:
            write_frame(p.stdin.fileno(), msg)
        except (OSError, ValueError):
            raise _ChildGone() from None

    def _wait_reply(self, deadline: float) -> Optional[dict[str, Any]]:
        """The next reply, or None at the deadline; _ChildGone when the child exits."""
        p = self.proc
        if p is None or p.stdout is None:
            raise _ChildGone()
        try:
            fd = p.stdout.fileno()
            while not self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                ready, _, _ = select.select([fd], [], [], min(left, 1.0))
                if ready:
                    chunk = os.read(fd, 1 << 20)
                    if not chunk:
                        raise _ChildGone()
                    self._pending.extend(self._reader.feed(chunk))
        except (OSError, ValueError):  # the pipe was closed under us (kill() from close())
            raise _ChildGone() from None
        return self._pending.pop(0)

    def _death_message(self) -> str:
        p = self.proc
        rc = None
        if p is not None:
            try:
                rc = p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        if rc in (-signal.SIGABRT, -signal.SIGKILL, -signal.SIGSEGV, 134, 137):
            return f"grammar too large: compile exceeded {self.limits.memory_text()} of memory"
        return f"grammar compiler process died (exit status {rc})"
