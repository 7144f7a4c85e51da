"""CompiledGrammar: an outlines-core Index over one TokenVocab, plus per-state caches. Torch-free.

States are the Index's own ints. Shared by every request with the same grammar (the cache hands out
one object per (grammar key, tokenizer id)); only the scheduler thread touches its caches.

Invariants:
- allowed(state).ids: the text tokens allowed at `state`, ascending int64, never EOS nor the end
  sentinel (EOS and the request's stop ids are added by the mask only at final states, state.py).
- is_final(state): the output so far is in the grammar's language, i.e. the end sentinel is accepted
  here and leads to the index's final state (the index compiles `(?:R)S`, see vocab.py). The
  index's own is_final_state() is true only after S and is never used directly.
- Every id in allowed(state).ids has a next state (Index.get_next_state is not None).
- Per-state caches are LRUs bounded in bytes (a large grammar visits many states).
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from radixlang_runtime.constrained.compile_index import build_index
from radixlang_runtime.constrained.lru import LRU
from radixlang_runtime.constrained.mask_prefetch import take_prefetched
from radixlang_runtime.constrained.spec import GrammarSpec
from radixlang_runtime.constrained.vocab import TokenVocab

ALLOWED_CACHE_BYTES = 16 << 20  # per grammar: allowed-id arrays (+ the mask's tensors); counted in the cache's bytes
FORCED_CACHE_ENTRIES = 4096  # per grammar: jump-forward results


def walk(grammar: Any, token_ids: list[int], state: Optional[int] = None) -> Optional[int]:
    """Walk token_ids from `state` (default: the grammar's initial state) by its next_state; the end state, or
    None at an illegal token. Every grammar kind's `accepts` (CompiledGrammar, MatcherGrammar)."""
    s = grammar.initial_state if state is None else state
    for t in token_ids:
        nxt = grammar.next_state(s, t)
        if nxt is None:
            return None
        s = nxt
    return s


@dataclass
class AllowedSet:
    ids: np.ndarray  # int64 [n], ascending: text tokens allowed at the state (no EOS)
    is_final: bool  # EOS / stop tokens may end the output here
    device_cache: dict[Any, Any] = field(default_factory=dict)  # mask.py: per-device tensors of ids

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes)


def allowed_weight(a: AllowedSet) -> int:
    """Bytes an allowed set holds once the mask built its tensor: the ids + the device copy (ids, or a bool
    row of the logits width for a dense state) + the record."""
    return 2 * a.nbytes + 200


class CompiledGrammar:
    def __init__(self, spec: GrammarSpec, index: Any, vocab: TokenVocab, index_nbytes: int = 0,
                 compile_seconds: float = 0.0):
        self.spec = spec
        self.index = index
        self.vocab = vocab
        self.index_nbytes = index_nbytes  # pickled size: the cache's weight for this grammar
        self.compile_seconds = compile_seconds
        self.guard: Any = None  # step_guard.StepGuard: uncached lookups run under its deadline (None: inline)
        self.broken: Optional[str] = None  # set when a lookup was abandoned (never, for an outlines index)
        self.initial_state: int = index.get_initial_state()
        self._allowed: LRU[int, AllowedSet] = LRU(1 << 30, ALLOWED_CACHE_BYTES)
        self.pending_masks: dict[int, Any] = {}  # state -> its allowed set's call under way (mask_prefetch.py)
        self.forced_cache: LRU[int, Any] = LRU(FORCED_CACHE_ENTRIES)  # jump_forward.py's per-state results
        # jump_forward.draft_tokens: state -> the token the model chose there when it rejected a draft
        self.draft_prefs: LRU[int, int] = LRU(FORCED_CACHE_ENTRIES)

    # ------------------------------------------------------------------ per state
    def _compute_allowed(self, state: int) -> AllowedSet:
        ids = np.array(self.index.get_allowed_tokens(state) or [], dtype=np.int64)
        ids = np.sort(ids[(ids != self.vocab.eos_token_id) & (ids < self.vocab.logits_width)])
        end = self.index.get_next_state(state, self.vocab.sentinel_id)
        return AllowedSet(ids, end is not None and bool(self.index.is_final_state(end)))

    def allowed(self, state: int) -> AllowedSet:
        a = self._allowed.get(state)
        if a is None:
            a = take_prefetched(self, state) if self.pending_masks else None  # under way: mask_prefetch.py
            if a is None:
                fn = self._compute_allowed
                a = fn(state) if self.guard is None else self.guard.run(self, fn, state)
            self._allowed.put(state, a, allowed_weight(a))
        return a

    def compute_allowed(self, state: int) -> AllowedSet:
        """The allowed set of `state`, computed now (mask_prefetch.py runs it on the step guard's thread)."""
        return self._compute_allowed(state)

    def cached_allowed(self, state: int) -> Optional[AllowedSet]:
        return self._allowed.get(state)

    def store_allowed(self, state: int, a: AllowedSet) -> None:
        self._allowed.put(state, a, allowed_weight(a))

    @property
    def nbytes(self) -> int:
        """What this grammar holds: the index (pickled size) + the allowed-set cache (the grammar cache's weight)."""
        return 2 * self.index_nbytes + int(self._allowed.total)

    def next_state(self, state: int, token_id: int) -> Optional[int]:
        if token_id == self.vocab.eos_token_id or not 0 <= token_id < self.vocab.logits_width:
            return None
        return self.index.get_next_state(state, token_id)

    def is_final(self, state: int) -> bool:
        return self.allowed(state).is_final

    def accepts(self, token_ids: list[int], state: Optional[int] = None) -> Optional[int]:
        return walk(self, token_ids, state)

    def __repr__(self) -> str:
        return f"CompiledGrammar({self.spec.describe()}, {self.index_nbytes} bytes)"


def compile_grammar(spec: GrammarSpec, vocab: TokenVocab, backend: str = "outlines") -> Any:
    """Compile in this process (tests, benchmarks, warm-up). The server uses GrammarCompiler (cache.py):
    a hostile grammar must not be able to take the scheduler's memory or time. Other backends than
    outlines answer a matcher_grammar.MatcherGrammar (the same interface)."""
    if backend != "outlines":
        from radixlang_runtime.constrained import backends

        t0 = time.perf_counter()
        vocab_obj = backends.vocab_object(backend, vocab.eos_token_id, vocab.sentinel, vocab.byte_map())
        payload = backends.compile_payload(backend, spec.kind, spec.compile_text, vocab_obj)
        return backends.load_grammar(backend, spec, payload, vocab, time.perf_counter() - t0)
    from radixlang_runtime.constrained.backends import refuse_unsupported

    refuse_unsupported(backend, spec.kind)
    t0 = time.perf_counter()
    index = build_index(spec.kind, spec.compile_text, vocab.outlines_vocabulary(), vocab.sentinel)
    elapsed = time.perf_counter() - t0
    return CompiledGrammar(spec, index, vocab, len(pickle.dumps(index)), elapsed)


def grammar_from_pickle(spec: GrammarSpec, data: bytes, vocab: TokenVocab, compile_seconds: float,
                        backend: str = "outlines") -> Any:
    """A compile worker's answer (a pickled payload from our own child process) -> the grammar object."""
    if backend != "outlines":
        from radixlang_runtime.constrained.backends import load_grammar

        return load_grammar(backend, spec, pickle.loads(data), vocab, compile_seconds)
    return CompiledGrammar(spec, pickle.loads(data), vocab, len(data), compile_seconds)
