"""MatcherGrammar: a stateful matcher (xgrammar, llguidance) behind CompiledGrammar's interface. Torch-free.

The context-free backends keep their parse state inside one mutable matcher, while the runtime wants
states it can copy and compare (GrammarState.copy, drafts, per-state caches). States here are nodes
of a prefix trie: state 0 is the empty output, node (p, t) the output of p followed by token t; equal
token paths share a node. One matcher per grammar is moved between nodes: rollback to the common
ancestor, then accept the tokens down to the target (a request decoding one token at a time moves it
by one token per step; a backend that cannot roll back replays from the start).

Invariants (the same as grammar.py's, so mask.py, state.py and jump_forward.py need nothing else):
- allowed(state).ids: the text tokens the matcher allows at the state (ascending, no EOS, < logits width);
  is_final: the matcher allows EOS there (the output is complete).
- next_state(state, t) is not None iff t is in allowed(state).ids.
- forced_token_ids(state) (llguidance): its forced tokens, walked through next_state likewise.
- forced_prefix(state): bytes the backend's matcher says every continuation starts with (xgrammar's
  find_jump_forward_string, llguidance's compute_ff_bytes); jump_forward walks them through
  next_state, so a string the mask would not allow is cut where the mask stops.
- The trie keeps every node a request reached (ids must stay valid while a request holds them); the
  per-state caches above it are bounded LRUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol

import numpy as np

from radixlang_runtime.constrained.grammar import (ALLOWED_CACHE_BYTES, FORCED_CACHE_ENTRIES, AllowedSet,
                                                   allowed_weight, walk)
from radixlang_runtime.constrained.lru import LRU
from radixlang_runtime.constrained.mask_prefetch import take_prefetched
from radixlang_runtime.constrained.spec import GrammarSpec
from radixlang_runtime.constrained.vocab import TokenVocab


class Matcher(Protocol):
    """What a backend adapter provides (xgrammar_backend.XgrammarMatcher, llguidance_backend.LLMatcherAdapter)."""

    def accept(self, token_id: int) -> bool: ...
    def rollback(self, n: int) -> bool: ...  # False: not possible (the caller replays from the start)
    def reset(self) -> None: ...
    def allowed_bits(self) -> np.ndarray: ...  # bool [>= logits width]: tokens allowed now (EOS included)
    def forced_prefix(self) -> bytes: ...


NODE_BYTES = 160  # one trie node (_Node + its dict entry), counted in nbytes


@dataclass
class _Node:
    parent: int
    token: int
    depth: int


class MatcherGrammar:
    def __init__(self, spec: GrammarSpec, matcher: Matcher, vocab: TokenVocab, backend: str,
                 index_nbytes: int = 0, compile_seconds: float = 0.0, native_nbytes: int = 0):
        self.spec = spec
        self.backend = backend
        self.matcher = matcher
        self.vocab = vocab
        self.index_nbytes = index_nbytes
        self.native_nbytes = native_nbytes  # the backend's own structures (estimated at load)
        self.compile_seconds = compile_seconds
        self.guard: Any = None  # step_guard.StepGuard: native calls run under its deadline (None: inline)
        self.broken: Optional[str] = None  # set when a call was abandoned: the matcher is never used again
        self.initial_state = 0
        self._nodes: list[_Node] = [_Node(-1, -1, 0)]
        self._children: dict[tuple[int, int], int] = {}
        self._pos = 0  # the node the matcher stands at
        self._allowed: LRU[int, AllowedSet] = LRU(1 << 30, ALLOWED_CACHE_BYTES)
        self.pending_masks: dict[int, Any] = {}  # state -> its allowed set's call under way (mask_prefetch.py)
        self._forced_prefix: LRU[int, bytes] = LRU(FORCED_CACHE_ENTRIES)
        self.forced_cache: LRU[int, Any] = LRU(FORCED_CACHE_ENTRIES)
        self.draft_prefs: LRU[bytes, int] = LRU(FORCED_CACHE_ENTRIES)  # keyed by forced bytes (jump_forward.pref_key)

    # ------------------------------------------------------------------ moving the matcher
    def _path(self, node: int, stop: int) -> list[int]:
        """Tokens from ancestor `stop` down to `node`."""
        out = []
        while node != stop:
            n = self._nodes[node]
            out.append(n.token)
            node = n.parent
        out.reverse()
        return out

    def _ancestor(self, a: int, b: int) -> int:
        nodes = self._nodes
        while nodes[a].depth > nodes[b].depth:
            a = nodes[a].parent
        while nodes[b].depth > nodes[a].depth:
            b = nodes[b].parent
        while a != b:
            a, b = nodes[a].parent, nodes[b].parent
        return a

    def _goto(self, node: int) -> None:
        if node == self._pos:
            return
        anc = self._ancestor(self._pos, node)
        back = self._nodes[self._pos].depth - self._nodes[anc].depth
        if back and not self.matcher.rollback(back):
            self.matcher.reset()
            anc = 0
        self._pos = anc
        for t in self._path(node, anc):
            ok = self.matcher.accept(t)
            assert ok, f"{self.backend} matcher refused token {t} on a path it allowed"
        self._pos = node

    # ------------------------------------------------------------------ per state
    def _guarded(self, fn: Any, *args: Any) -> Any:
        """A native call: on the step guard's thread with its deadline (step_guard.py) when one is set."""
        if self.guard is None:
            if self.broken:
                from radixlang_runtime.constrained.step_guard import GrammarBudgetExceeded

                raise GrammarBudgetExceeded(self.broken)
            return fn(*args)
        return self.guard.run(self, fn, *args)

    def _compute_allowed(self, state: int) -> AllowedSet:
        self._goto(state)
        w = self.vocab.logits_width
        bits = self.matcher.allowed_bits()[:w]
        final = bool(bits[self.vocab.eos_token_id])
        ids = np.flatnonzero(bits).astype(np.int64)
        ids = ids[ids != self.vocab.eos_token_id]
        return AllowedSet(ids, final)

    def allowed(self, state: int) -> AllowedSet:
        a = self._allowed.get(state)
        if a is None:
            a = take_prefetched(self, state) if self.pending_masks else None  # under way: mask_prefetch.py
            if a is None:
                a = self._guarded(self._compute_allowed, state)
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
        """What this grammar holds: its payload, the trie, and the allowed-set cache (the grammar cache's weight)."""
        return self.index_nbytes + self.native_nbytes + NODE_BYTES * len(self._nodes) + int(self._allowed.total)

    def next_state(self, state: int, token_id: int) -> Optional[int]:
        if token_id == self.vocab.eos_token_id or not 0 <= token_id < self.vocab.logits_width:
            return None
        child = self._children.get((state, token_id))
        if child is not None:
            return child
        ids = self.allowed(state).ids
        pos = int(np.searchsorted(ids, token_id))
        if pos >= len(ids) or int(ids[pos]) != token_id:
            return None
        child = len(self._nodes)
        self._nodes.append(_Node(state, token_id, self._nodes[state].depth + 1))
        self._children[(state, token_id)] = child
        return child

    def is_final(self, state: int) -> bool:
        return self.allowed(state).is_final

    def _compute_forced_prefix(self, state: int) -> bytes:
        self._goto(state)
        return self.matcher.forced_prefix()

    def forced_prefix(self, state: int) -> bytes:
        hit = self._forced_prefix.get(state)
        if hit is None:
            hit = self._guarded(self._compute_forced_prefix, state)
            self._forced_prefix.put(state, hit)
        return hit

    def _compute_forced_tokens(self, state: int) -> list[int]:
        self._goto(state)
        return self.matcher.forced_token_ids()

    def forced_token_ids(self, state: int) -> Optional[list[int]]:
        """The matcher's own forced tokens when it names them (llguidance), else None (jump_forward then
        tokenizes the forced bytes itself)."""
        if not hasattr(self.matcher, "forced_token_ids"):
            return None
        return self._guarded(self._compute_forced_tokens, state)

    def accepts(self, token_ids: list[int], state: Optional[int] = None) -> Optional[int]:
        return walk(self, token_ids, state)

    @property
    def num_states(self) -> int:
        return len(self._nodes)

    def __repr__(self) -> str:
        return f"MatcherGrammar({self.backend}, {self.spec.describe()}, {len(self._nodes)} states)"
