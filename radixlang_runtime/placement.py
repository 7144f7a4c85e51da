"""Data-parallel placement (torch-free): which of M replicas gets each new request.

Used by the tokenizer manager when dp_size > 1 (--load-balance-method); each replica is a scheduler
process with its own radix KV cache. Policies, as SGLang's router:
- cache_aware (SGLang's CacheAwarePolicy): if the in-flight loads are imbalanced (max - min >
  balance_abs_threshold and max > min * balance_rel_threshold), the least-loaded replica. Otherwise
  the replica whose approximate tree matches the longest prefix, if that match covers more than
  cache_threshold of the prompt; else the replica whose tree holds the fewest tokens, so new
  prefixes spread over the replicas. Ties: lower load, then lowest index.
- round_robin: replicas in turn. shortest_queue: the least loaded (ties: lowest index).
route(..., eligible=[...]) limits every policy to those replicas (the PD router's healthy instances);
loads and trees of the others still count nowhere in the choice.

Invariants:
- loads[i] == number of in-flight rids routed to replica i (route adds, finish removes, at most
  once per rid); all >= 0;
- each replica's approximate tree is a mem/radix_cache.py RadixCache (page size 1, dummy slots, never
  locked) holding the prompts routed there (all policies) and never more than tree_capacity_tokens
  tokens: past it, LRU leaves are evicted (down to a low-water mark, so the O(tree) eviction pass is
  amortized over many inserts). It approximates, never mirrors, the replica's real cache;
- per request: one match per replica and one insert, O(len(input_ids)) each (plus amortized eviction).
Not thread-safe: call it from the one event loop thread that owns the tokenizer manager.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from radixlang_runtime.mem.radix_cache import RadixCache

POLICIES = ("cache_aware", "round_robin", "shortest_queue")
# Eviction frees this fraction of the capacity beyond the excess, so the O(tree) pass runs at most
# once per capacity/EVICT_SLACK_DIV inserted tokens.
EVICT_SLACK_DIV = 16


@dataclass(frozen=True)
class PlacementConfig:
    policy: str = "cache_aware"
    cache_threshold: float = 0.5  # SGLang router default: min prefix match rate to follow the cache
    balance_abs_threshold: int = 32  # SGLang router defaults for "load is imbalanced"
    balance_rel_threshold: float = 1.0001
    tree_capacity_tokens: int = 1 << 20  # per replica; set it to the replica's KV pool size

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown router policy {self.policy!r}; expected one of {POLICIES}")
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0:
            raise ValueError(f"balance_abs_threshold must be >= 0, got {self.balance_abs_threshold}")
        if not self.balance_rel_threshold >= 1.0:  # also rejects NaN
            raise ValueError(f"balance_rel_threshold must be >= 1.0, got {self.balance_rel_threshold}")
        if self.tree_capacity_tokens < 1:
            raise ValueError(f"tree_capacity_tokens must be >= 1, got {self.tree_capacity_tokens}")


class Placement:
    def __init__(self, num_replicas: int, config: PlacementConfig = PlacementConfig()):
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        self.num_replicas = num_replicas
        self.config = config
        self._trees = [RadixCache(page_size=1) for _ in range(num_replicas)]
        self._loads = [0] * num_replicas
        self._in_flight: dict[str, int] = {}  # rid -> replica; loads are its per-replica counts
        self._routed = [0] * num_replicas  # requests ever routed to each replica
        self._rr_next = 0  # round_robin: the next replica
        # cache_aware decisions by rule; they sum to the cache_aware requests routed
        self._cache_routed = 0
        self._balance_routed = 0
        self._smallest_tree_routed = 0

    # ------------------------------------------------------------------ routing
    def route(self, rid: str, input_ids: Sequence[int], eligible: Optional[Sequence[int]] = None) -> int:
        """Pick a replica for a new request, record it as in flight there (load += 1), and (all
        policies) insert input_ids into that replica's approximate tree. A rid already in flight ->
        ValueError. eligible: the replicas it may go to (default all; ascending, non-empty)."""
        if rid in self._in_flight:
            raise ValueError(f"request {rid!r} is already in flight on replica {self._in_flight[rid]}")
        cands = range(self.num_replicas) if eligible is None else sorted(set(eligible))
        if not cands or cands[0] < 0 or cands[-1] >= self.num_replicas:
            raise ValueError(f"eligible replicas must be a non-empty subset of 0..{self.num_replicas - 1}, "
                             f"got {eligible!r}")
        ids = input_ids if type(input_ids) is list else list(input_ids)  # tree keys must be lists
        policy = self.config.policy
        if policy == "round_robin":
            # the first eligible replica at or after the turn's position
            choice = min(cands, key=lambda i: ((i - self._rr_next) % self.num_replicas, i))
            self._rr_next = (choice + 1) % self.num_replicas
        elif policy == "shortest_queue":
            choice = self._least_loaded(cands)
        else:
            choice = self._cache_aware(ids, cands)
        self._in_flight[rid] = choice
        self._loads[choice] += 1
        self._routed[choice] += 1
        self._insert(choice, ids)
        return choice

    def _least_loaded(self, cands: Sequence[int]) -> int:
        return min(cands, key=lambda i: (self._loads[i], i))

    def _cache_aware(self, ids: list[int], cands: Sequence[int]) -> int:
        cfg, loads = self.config, self._loads
        hi, lo = max(loads[i] for i in cands), min(loads[i] for i in cands)
        if hi - lo > cfg.balance_abs_threshold and hi > lo * cfg.balance_rel_threshold:
            self._balance_routed += 1
            return self._least_loaded(cands)
        # match_prefix also refreshes LRU times on the trees that lose: a prefix any replica holds is
        # still in demand, as SGLang's shared tree treats it.
        matches = {i: self._trees[i].match_prefix(ids).length for i in cands}
        best = min(cands, key=lambda i: (-matches[i], loads[i], i))
        if ids and matches[best] / len(ids) > cfg.cache_threshold:
            self._cache_routed += 1
            return best
        self._smallest_tree_routed += 1
        return min(cands, key=lambda i: (self._trees[i].total_size(), loads[i], i))

    def _insert(self, replica: int, ids: list[int]) -> None:
        cap = self.config.tree_capacity_tokens
        ids = ids[:cap]  # a prompt longer than the tree keeps its head, the part others can share
        tree = self._trees[replica]
        tree.insert(ids, [0] * len(ids))
        total = tree.total_size()
        if total > cap:
            # The new path (len(ids) tokens, all stamped by this insert) is the most recently used, so
            # LRU takes every other leaf first; evicting at most total - len(ids) tokens never reaches it.
            tree.evict(min(total - cap + cap // EVICT_SLACK_DIV, total - len(ids)))
            if tree.total_size() > cap:
                raise AssertionError("router tree still over capacity after eviction")

    # ------------------------------------------------------------------ lifecycle
    def replica_of(self, rid: str) -> Optional[int]:
        """Where an in-flight request went (for aborts); None if it is not in flight."""
        return self._in_flight.get(rid)

    def finish(self, rid: str) -> None:
        """The request ended (finished, error, abort): load -= 1. Unknown or already finished: no-op."""
        replica = self._in_flight.pop(rid, None)
        if replica is not None:
            self._loads[replica] -= 1

    def reset_trees(self) -> None:
        """Forget every approximate tree (after a cache flush on the replicas); loads are unchanged."""
        for tree in self._trees:
            tree.reset()

    # ------------------------------------------------------------------ inspection
    def loads(self) -> list[int]:
        return list(self._loads)

    def stats(self) -> dict[str, Any]:
        return {
            "policy": self.config.policy,
            "loads": list(self._loads),
            "tree_tokens": [t.total_size() for t in self._trees],
            "routed": list(self._routed),
            "cache_routed": self._cache_routed,  # cache_aware: followed the longest match
            "balance_routed": self._balance_routed,  # cache_aware: loads imbalanced, least loaded
            "smallest_tree_routed": self._smallest_tree_routed,  # cache_aware: match too short
        }

    def check_integrity(self) -> None:
        counted = [0] * self.num_replicas
        for replica in self._in_flight.values():
            counted[replica] += 1
        if counted != self._loads:
            raise AssertionError(f"router loads {self._loads}, but in-flight rids per replica {counted}")
        if any(n < 0 for n in self._loads):
            raise AssertionError(f"negative router load: {self._loads}")
        decided = self._cache_routed + self._balance_routed + self._smallest_tree_routed
        if decided > sum(self._routed):
            raise AssertionError(f"{decided} cache_aware decisions but {sum(self._routed)} requests routed")
        for i, tree in enumerate(self._trees):
            tree.check_integrity()
            if tree.protected_size():
                raise AssertionError(f"router tree {i} holds locked nodes; it must never lock")
            if tree.total_size() > self.config.tree_capacity_tokens:
                raise AssertionError(f"router tree {i} holds {tree.total_size()} tokens, over "
                                     f"capacity {self.config.tree_capacity_tokens}")
