"""GrammarCompiler: compile grammars off the caller's thread, cache them. Torch-free.

submit(spec) never blocks and never raises for a bad grammar: it returns a GrammarHandle whose
poll() is "pending" | "ready" | "error". The scheduler keeps a constrained request in its grammar
queue while pending, admits it when ready (handle.grammar), and finishes it with handle.error (a
400-style message) on error. Other requests keep decoding meanwhile.

- Compiles run in `num_workers` CompileWorker processes (worker.py): time limit + memory cap each,
  so at most num_workers compiles run at once; the rest wait in a FIFO of at most max_queued jobs.
- Cache: an LRU of grammars keyed by (spec.key, tokenizer id), bounded by entries and by bytes: each
  grammar weighs its `nbytes` (payload, the backend's own structures, its allowed-set cache), reweighed
  at every submit since the allowed sets grow as requests decode; errors are cached too (a hostile
  grammar costs its time limit once). clear() (/flush_cache) drops both and trims the heap.
- Grammar calls during decoding run under `guard` (step_guard.StepGuard: per call and per request
  deadlines); a grammar abandoned mid-call leaves the cache and its error is cached.
  Optional disk cache of pickled indexes (disk_dir, per tokenizer id), read and written by the child.
- Several submits of one grammar while it compiles share one handle (one compile).
Invariants: a key is in at most one of {ready LRU, error LRU, in flight}; every wait is bounded;
close() kills the children and joins the threads (bounded).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Literal, Optional

from radixlang_runtime.constrained.backends import check_backend
from radixlang_runtime.constrained.grammar import CompiledGrammar, grammar_from_pickle
from radixlang_runtime.constrained.lru import LRU
from radixlang_runtime.constrained.spec import GrammarSpec
from radixlang_runtime.constrained.step_guard import StepGuard, StepLimits
from radixlang_runtime.constrained.vocab import TokenVocab
from radixlang_runtime.constrained.worker import CompileWorker, WorkerLimits, vocab_message
from radixlang_runtime.utils.release_memory import release_memory

Status = Literal["pending", "ready", "error"]


@dataclass(frozen=True)
class GrammarCacheConfig:
    num_workers: int = 2  # concurrent compiles (one process each)
    timeout_s: float = 20.0  # per compile (json_object alone takes 5-9 s on a loaded 2-core CPU)
    memory_bytes: int = 2 << 30  # per compile process (RLIMIT_AS)
    max_queued: int = 1024  # compiles waiting for a worker
    cache_entries: int = 256
    cache_bytes: int = 1 << 30  # sum of the grammars' bytes held (grammar.nbytes: payload, backend, allowed sets)
    error_entries: int = 1024
    disk_dir: Optional[str] = None  # pickled indexes on disk (None: memory only)
    backend: str = "outlines"  # backends.py (--grammar-backend)
    step_timeout_s: float = 1.0  # one grammar call on the scheduler's behalf (--grammar-step-timeout)
    request_timeout_s: float = 30.0  # one request's grammar calls in all (--grammar-request-timeout)

    def __post_init__(self) -> None:
        check_backend(self.backend)
        assert self.num_workers >= 1 and self.max_queued >= 1 and self.cache_entries >= 1


def _weight(grammar: CompiledGrammar) -> float:
    return max(grammar.nbytes, 1)


class GrammarHandle:
    """A grammar being compiled (or already compiled / refused). poll() never blocks."""

    def __init__(self, spec: GrammarSpec):
        self.spec = spec
        self._done = threading.Event()
        self._grammar: Optional[CompiledGrammar] = None
        self._error: Optional[str] = None
        self.submitted_at = time.perf_counter()
        self.cached = False  # answered from the memory cache at submit

    def poll(self) -> Status:
        if not self._done.is_set():
            return "pending"
        return "ready" if self._grammar is not None else "error"

    def wait(self, timeout: float) -> Status:
        """Block up to `timeout` seconds (tests, warm-up; the scheduler uses poll())."""
        self._done.wait(timeout)
        return self.poll()

    @property
    def grammar(self) -> CompiledGrammar:
        assert self._grammar is not None, f"grammar not ready ({self.poll()})"
        return self._grammar

    @property
    def error(self) -> Optional[str]:
        return self._error

    def _resolve(self, grammar: Optional[CompiledGrammar], error: Optional[str]) -> None:
        self._grammar, self._error = grammar, error
        self._done.set()


@dataclass
class _Job:
    key: tuple[str, str]
    handle: GrammarHandle


class GrammarCompiler:
    def __init__(self, vocab: TokenVocab, config: GrammarCacheConfig = GrammarCacheConfig()):
        self.vocab = vocab
        self.config = config
        self.limits = WorkerLimits(config.timeout_s, config.memory_bytes, backend=config.backend)
        self._lock = threading.Lock()
        self.guard = StepGuard(StepLimits(config.step_timeout_s, config.request_timeout_s), self._forget)
        self._ready: LRU[tuple[str, str], CompiledGrammar] = LRU(config.cache_entries, config.cache_bytes)
        self._errors: LRU[tuple[str, str], str] = LRU(config.error_entries)
        self._inflight: dict[tuple[str, str], GrammarHandle] = {}
        self._queue: queue.Queue[Optional[_Job]] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self.workers: list[CompileWorker] = []
        self._closed = False
        self.stats = {"hits": 0, "misses": 0, "compiled": 0, "from_disk": 0, "errors": 0, "compile_s": 0.0}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Spawn the worker threads and their processes (idempotent; submit() calls it)."""
        with self._lock:
            if self._threads or self._closed:
                return
            msg = vocab_message(self.vocab)
            for i in range(self.config.num_workers):
                w = CompileWorker(msg, self.limits)
                t = threading.Thread(target=self._run, args=(w,), name=f"grammar-compile-{i}", daemon=True)
                self.workers.append(w)
                self._threads.append(t)
                t.start()

    def close(self, timeout: float = 10.0) -> None:
        self._closed = True
        self.guard.close()
        for _ in self._threads:
            self._queue.put(None)
        for w in self.workers:
            w.kill()  # a compile in flight ends now; its thread reports an error and exits
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            pending = list(self._inflight.values())
            self._inflight.clear()
        for h in pending:
            h._resolve(None, "grammar compiler closed")

    def clear(self) -> None:
        """Drop cached grammars and errors (flush_cache), and hand their memory back to the OS (requests
        still running keep theirs until they end). Compiles in flight finish normally."""
        with self._lock:
            self._ready.clear()
            self._errors.clear()
        release_memory()

    def _forget(self, grammar: CompiledGrammar, error: str) -> None:
        """StepGuard: `grammar` was abandoned mid-call. Later requests for it get `error` (a 400) at once."""
        key = (grammar.spec.key, self.vocab.tokenizer_id)
        with self._lock:
            if self._ready.get(key) is grammar:
                self._ready.remove(key)
            self._errors.put(key, f"{error} on an earlier request with this grammar")

    @property
    def cached_bytes(self) -> int:
        with self._lock:
            self._ready.reweigh(_weight)
            return int(self._ready.total)

    # ------------------------------------------------------------------ requests
    def submit(self, spec: GrammarSpec) -> GrammarHandle:
        key = (spec.key, self.vocab.tokenizer_id)
        h = GrammarHandle(spec)
        with self._lock:
            self._ready.reweigh(_weight)  # allowed-set caches grew while requests decoded
            g = self._ready.get(key)
            if g is not None:
                self.stats["hits"] += 1
                h.cached = True
                h._resolve(g, None)
                return h
            err = self._errors.get(key)
            if err is not None:
                h._resolve(None, err)
                return h
            if key in self._inflight:
                return self._inflight[key]
            if self._closed:
                h._resolve(None, "grammar compiler closed")
                return h
            if self._queue.qsize() >= self.config.max_queued:
                h._resolve(None, f"grammar queue full ({self.config.max_queued} compiles waiting)")
                return h
            self.stats["misses"] += 1
            self._inflight[key] = h
        self.start()
        self._queue.put(_Job(key, h))
        return h

    def get(self, spec: GrammarSpec) -> Optional[CompiledGrammar]:
        with self._lock:
            return self._ready.get((spec.key, self.vocab.tokenizer_id))

    @property
    def num_pending(self) -> int:
        with self._lock:
            return len(self._inflight)

    # ------------------------------------------------------------------ worker threads
    def _run(self, worker: CompileWorker) -> None:
        try:
            worker.start()  # warm: the first compile need not wait for a process
        except RuntimeError:
            pass  # retried by compile(); its error reaches the handle
        while not self._closed:
            try:
                job = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if job is None:
                break
            spec = job.handle.spec
            res = worker.compile(spec.kind, spec.compile_text, self.config.disk_dir)
            grammar, error = None, None
            if res.ok:
                try:
                    grammar = grammar_from_pickle(spec, res.index, self.vocab, res.seconds, self.config.backend)
                except Exception as e:  # noqa: BLE001 - reported to the request, not raised in a thread
                    error = f"grammar could not be loaded: {e}"
            else:
                error = res.error
            with self._lock:
                self._inflight.pop(job.key, None)
                if grammar is not None:
                    grammar.guard = self.guard
                    self._ready.put(job.key, grammar, _weight(grammar))
                    self.stats["compiled" if not res.from_disk else "from_disk"] += 1
                    self.stats["compile_s"] += res.seconds
                elif not self._closed:
                    self._errors.put(job.key, error or "compile failed")
                    self.stats["errors"] += 1
            job.handle._resolve(grammar, error)
        worker.kill()
