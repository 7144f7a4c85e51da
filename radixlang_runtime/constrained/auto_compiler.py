"""KindRoutedCompiler: --grammar-backend auto (the default). Torch-free.

One GrammarCompiler (cache.py) per backend, each built on the first grammar its kind sends it
(backends.AUTO_PICK: regex / json_schema -> outlines, ebnf / structural_tag -> xgrammar), so a server
that never sees an EBNF grammar never starts xgrammar's compile processes. It answers what the
scheduler's GrammarQueue uses of a GrammarCompiler: start, submit, get, clear, close, guard, cached_bytes,
num_pending, stats
(summed over the backends).
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from radixlang_runtime.constrained.backends import AUTO, backend_for
from radixlang_runtime.constrained.cache import GrammarCompiler, GrammarHandle
from radixlang_runtime.constrained.grammar import CompiledGrammar
from radixlang_runtime.constrained.spec import GrammarSpec


class KindRoutedCompiler:
    def __init__(self, make: Callable[[str], GrammarCompiler]):
        """make(backend) -> that backend's GrammarCompiler (sharing the one TokenVocab)."""
        self._make = make
        self._lock = threading.Lock()
        self.compilers: dict[str, GrammarCompiler] = {}

    def compiler_for(self, kind: str) -> GrammarCompiler:
        backend = backend_for(AUTO, kind)
        with self._lock:
            c = self.compilers.get(backend)
            if c is None:
                c = self.compilers[backend] = self._make(backend)
        c.start()  # idempotent
        return c

    def start(self) -> None:
        """The regex / json_schema backend, warm (the common kinds); the others start on first use."""
        self.compiler_for("regex")

    def submit(self, spec: GrammarSpec) -> GrammarHandle:
        return self.compiler_for(spec.kind).submit(spec)

    def get(self, spec: GrammarSpec) -> Optional[CompiledGrammar]:
        c = self.compilers.get(backend_for(AUTO, spec.kind))
        return None if c is None else c.get(spec)

    def clear(self) -> None:
        for c in list(self.compilers.values()):
            c.clear()

    def close(self, timeout: float = 10.0) -> None:
        for c in list(self.compilers.values()):
            c.close(timeout)

    @property
    def guard(self):
        """The step guard whose limits every backend's compiler shares (a request's budget comes from it)."""
        return self.compiler_for("regex").guard

    def cached_bytes(self) -> int:
        return sum(c.cached_bytes() for c in list(self.compilers.values()))

    @property
    def num_pending(self) -> int:
        return sum(c.num_pending for c in list(self.compilers.values()))

    @property
    def stats(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for c in list(self.compilers.values()):
            for k, v in c.stats.items():
                total[k] = total.get(k, 0) + v
        return total
