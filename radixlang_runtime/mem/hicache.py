"""HiCache: the KV tiers under the radix tree (torch-free): L1 (the pool) -> L2 (disk) -> L3 (Redis).

scheduler/kv_manager.py calls it at three points:
- `backup(ids, slots, new_from)`: the whole records of a path that end past new_from are copied out of
  the pool (synchronously: their slots may be reused at once) and handed to the background writer
  for each tier that lacks them. On eviction (write_back, the default) and, with write_through, on
  every insert into the tree.
- `fetch(ids, start, limit)`: the records after an L1 match, walked along the key chain through the
  writer's queue, then L2, then L3 (MGETs of 16), stopping at the first miss or when `load_timeout_s`
  has passed; with load_policy "faster" (the default) a tier whose measured load cost per token
  exceeds the prefill's is skipped (tier_costs.py), "always" loads every hit. Loads run
  synchronously inside admission (a request waits only for its own records, with that bound); other
  requests wait for the step, not for a thread.
- `load_into(slots, payloads)`: the fetched records into freshly allocated slots.
- `swap_out(ids, slots)`: retract_decode's swap (vLLM's swap preemption): the retracted request's whole
  records are queued for the tiers at once, waiting up to `swap_wait_s` for room in the writer's queue
  (eviction's own backup drops when it is full), unless the measured costs say a load from the tiers
  is slower than recomputing (load_policy "faster"). Its readmission's `fetch` then swaps them back in;
  a record the tiers lost ends the load there and the rest is recomputed. With preemption_mode "recompute"
  (--preemption-mode recompute) nothing is swapped out at retraction: the readmission recomputes what L1
  lost, except what eviction's own backup happened to store.
Ids are radix keys: a LoRA adapter's or a cache_salt's requests pass their ids moved into that namespace's range
(mem/cache_namespace.py); their records are keyed from a root whose fingerprint names the adapter by its
content (`adapter_identity(lora_id)`, keys.adapter_identity) and the salt by its digest, the token ids without
the shift.
A record holds `record_tokens` tokens (a multiple of the page size, >= 32: one file per few tokens
would cost more than it saves); a prompt's tail shorter than a record is never stored.
Faults are misses (tiers/disk.py, tiers/redis_tier.py): outputs stay correct, no request fails.
Hybrid models (`state_port` set): an evicted node's state snapshot at a record's end is a record of its own
(`backup_state`, keyed by keys.state_key of the K/V record ending there), and `fetch` serves records only up to
the deepest record end whose snapshot the tiers hold, returning that snapshot with them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

from radixlang_runtime.mem.cache_namespace import TOKEN_MASK, salt_hex, split_namespace
from radixlang_runtime.mem.tier_costs import TierCosts
from radixlang_runtime.mem.tiers.disk import DiskTier
from radixlang_runtime.mem.tiers.keys import KVFingerprint, chain_keys, state_key
from radixlang_runtime.mem.tiers.redis_tier import RedisTier
from radixlang_runtime.mem.tiers.writer import TierWriter

logger = logging.getLogger(__name__)
TIER_NAMES = ("l1", "l2", "l3")
WRITE_POLICIES = ("write_back", "write_through")
LOAD_POLICIES = ("faster", "always")
PREEMPTION_MODES = ("swap", "recompute")  # vLLM's --preemption-mode values
MISS_MEMO_S = 1.0
L3_BATCH = 16  # records per Redis MGET
ROOTS_KEPT = 4096  # namespaces' chain roots memoized (one per adapter and cache_salt seen)


def record_tokens_for(page_size: int, at_least: int = 32) -> int:
    """Tokens per record: the smallest multiple of page_size >= at_least."""
    return -(-at_least // page_size) * page_size


def check_flush_tiers(tiers: object) -> Optional[list[str]]:
    """flush_cache's `tiers`: None (all) or a non-empty list of distinct names among TIER_NAMES."""
    if tiers is None:
        return None
    if not isinstance(tiers, list) or not tiers or not all(isinstance(t, str) for t in tiers):
        raise ValueError(f"tiers must be a non-empty list of tier names ({', '.join(TIER_NAMES)}); got {tiers!r}")
    bad = [t for t in tiers if t not in TIER_NAMES]
    if bad:
        raise ValueError(f"unknown tier(s) {', '.join(map(repr, bad))}: tiers are {', '.join(TIER_NAMES)}")
    return list(dict.fromkeys(tiers))


class StatePort(Protocol):
    """Hybrid models' state slots (mem/state_records.py): one snapshot as payload bytes."""

    def read_state(self, slot: int) -> bytes: ...

    def write_state(self, slot: int, payload: bytes) -> None: ...


class PagePort(Protocol):
    """The pool side (mem/kv_records.py): records of record_tokens slots each, as payload bytes."""

    def read_records(self, slots: list[int]) -> list[bytes]: ...

    def write_records(self, slots: list[int], payloads: list[bytes]) -> None: ...


@dataclass
class HiCacheConfig:
    record_tokens: int
    write_policy: str = "write_back"
    max_queued: int = 256  # records waiting for the writer; more are dropped (counted)
    load_timeout_s: float = 2.0  # the most one request's fetch may take; the rest is a miss
    load_policy: str = "faster"  # faster: skip a tier measured slower than recomputing | always
    swap_wait_s: float = 0.5  # the most one retraction's swap-out waits for room in the writer's queue
    preemption_mode: str = "swap"  # swap: a retracted request's whole records go to the tiers | recompute: none

    def __post_init__(self) -> None:
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {', '.join(PREEMPTION_MODES)}; "
                             f"got {self.preemption_mode!r}")
        if self.load_policy not in LOAD_POLICIES:
            raise ValueError(f"hicache_load_policy must be one of {', '.join(LOAD_POLICIES)}; got {self.load_policy!r}")
        if self.write_policy not in WRITE_POLICIES:
            raise ValueError(f"hicache_write_policy must be one of {', '.join(WRITE_POLICIES)}; "
                             f"got {self.write_policy!r}")


class HiCache:
    def __init__(self, cfg: HiCacheConfig, fingerprint: KVFingerprint, port: PagePort,
                 l2: Optional[DiskTier], l3: Optional[RedisTier],
                 adapter_identity: Optional[Callable[[int], Optional[str]]] = None):
        """adapter_identity: a LoRA adapter id -> its content identity (None: not served, nothing stored)."""
        if l2 is None and l3 is None:
            raise ValueError("hierarchical cache without a tier: need L2 (hicache_size > 0) or L3 (redis)")
        if fingerprint.record_tokens != cfg.record_tokens:
            raise ValueError("the fingerprint's record_tokens differs from the config's")
        self.cfg = cfg
        self.root = fingerprint.digest()
        self.fingerprint = fingerprint
        self.adapter_identity = adapter_identity
        # per adapter id (ids are never reused) and salt: (lora_id, salt key) -> root (cleared past ROOTS_KEPT)
        self._roots: dict[tuple[int, int], Optional[bytes]] = {(0, 0): self.root}
        self.port = port
        self.l2, self.l3 = l2, l3
        self.writer = TierWriter(cfg.max_queued)
        self._l3_known: OrderedDict[bytes, None] = OrderedDict()  # keys stored in (or read from) L3
        self.hit_tokens = {"queue": 0, "l2": 0, "l3": 0}  # tokens past the L1 match served by each
        self.lookups = 0
        self.loads = 0
        self.load_seconds = 0.0  # fetch + copy into the pool, all loads
        self.bytes_loaded = 0
        self.load_faults = 0
        # key -> when a fetch last missed it: a request waiting for admission does not ask the tiers
        # (a disk read, a Redis round trip) again at every step; forgotten after MISS_MEMO_S or when
        # this process backs the key up (another replica's L3 write shows after at most MISS_MEMO_S)
        self._recent_misses: OrderedDict[bytes, float] = OrderedDict()
        self.costs = TierCosts()  # a tier slower than recomputing is skipped (mem/tier_costs.py)
        # retract_decode's swap-out: tokens of whole records queued or already stored (out), tokens not
        # swapped because recomputing was measured cheaper (skipped) or the queue stayed full (dropped)
        self.swap_out_tokens = {"out": 0, "skipped": 0, "dropped": 0}
        # hybrid models: the radix nodes' state snapshots go with their K/V (backup_state); a fetch serves
        # records only up to the deepest one whose end has a snapshot in the tiers (None: not hybrid)
        self.state_port: Optional[StatePort] = None
        self.state_records = {"stored": 0, "loaded": 0}

    @property
    def write_through(self) -> bool:
        return self.cfg.write_policy == "write_through"

    # ------------------------------------------------------------------ keys
    def _keys(self, ids: list[int]) -> Optional[list[bytes]]:
        """The record keys of radix keys ids (one namespace: the base or one adapter, with or without a salt:
        mem/cache_namespace.py); None when the adapter has no identity here (unloaded before its first record).
        A salted namespace's root names the salt's digest, so its records are never another salt's."""
        ns = split_namespace(ids[0]) if ids else (0, 0)
        if ns not in self._roots:
            lora, salt = ns
            ident = "" if not lora else self.adapter_identity(lora) if self.adapter_identity is not None else None
            if len(self._roots) > ROOTS_KEPT:
                self._roots = {(0, 0): self.root}
            self._roots[ns] = None if ident is None else dataclasses.replace(
                self.fingerprint, adapter=ident, salt=salt_hex(salt)).digest()
        root = self._roots[ns]
        if root is None:
            return None
        return chain_keys(root, ids if ns == (0, 0) else [i & TOKEN_MASK for i in ids], self.cfg.record_tokens)

    # ------------------------------------------------------------------ writes
    def _lacking(self, key: bytes) -> list:
        tiers = []
        if self.l2 is not None and not self.l2.contains(key):
            tiers.append(self.l2)
        if self.l3 is not None and key not in self._l3_known:
            tiers.append(self.l3)
        return tiers

    def _know_l3(self, key: bytes) -> None:
        self._l3_known[key] = None
        self._l3_known.move_to_end(key)
        if len(self._l3_known) > 1 << 16:
            self._l3_known.popitem(last=False)

    def backup(self, ids: list[int], slots: list[int], new_from: int, deadline: Optional[float] = None) -> int:
        """Queue the whole records of ids[:len(slots)] that end past position new_from. Returns how many.
        deadline (time.monotonic()): wait for room in the queue until then (shutdown) instead of dropping."""
        t = self.cfg.record_tokens
        n = min(len(ids), len(slots)) // t
        first = new_from // t
        if first >= n:
            return 0
        keys = self._keys(ids[:n * t])
        if keys is None:
            return 0
        todo = [(i, tiers) for i in range(first, n) if (tiers := self._lacking(keys[i]))]
        if not todo:
            return 0
        payloads = self.port.read_records([s for i, _ in todo for s in slots[i * t:(i + 1) * t]])
        for (i, tiers), payload in zip(todo, payloads):
            self._recent_misses.pop(keys[i], None)  # no longer a miss here
            wait = 0.0 if deadline is None else max(deadline - time.monotonic(), 0.0)
            if self.writer.submit(keys[i], payload, tiers, wait) and self.l3 in tiers:
                self._know_l3(keys[i])
        return len(todo)

    def backup_state(self, ids: list[int], slot: int, deadline: Optional[float] = None) -> bool:
        """Queue the state snapshot in `slot` (the state after ids) for the tiers lacking it; only at a record's
        end (a snapshot elsewhere could not continue a load, which ends at a record's end). Whether queued."""
        t = self.cfg.record_tokens
        if self.state_port is None or not ids or len(ids) % t:
            return False
        keys = self._keys(ids)
        if keys is None:
            return False
        key = state_key(keys[-1])
        tiers = self._lacking(key)
        if not tiers:
            return False
        wait = 0.0 if deadline is None else max(deadline - time.monotonic(), 0.0)
        if self.writer.submit(key, self.state_port.read_state(slot), tiers, wait):
            self.state_records["stored"] += 1
            if self.l3 in tiers:
                self._know_l3(key)
            return True
        return False

    def _deepest_state(self, keys: list[bytes], n: int) -> tuple[int, Optional[bytes]]:
        """Of the first n records of keys, how many lead to the deepest record end with a state snapshot in
        the tiers, and that snapshot's payload ((0, None): none has one)."""
        for j in range(n, 0, -1):
            key = state_key(keys[j - 1])
            payload = self.writer.pending(key)
            if payload is None and self.l2 is not None:
                payload = self.l2.get(key)
            if payload is None and self.l3 is not None:
                payload = self.l3.get_many([key])[0]
            if payload is not None:
                return j, payload
        return 0, None

    def swap_out(self, ids: list[int], slots: list[int]) -> int:
        """A retracted request's K/V (positions 0 .. len(slots) - 1 of ids) to the tiers; its whole records
        only (the tail is recomputed). Returns the tokens now stored or queued (0 with preemption_mode recompute)."""
        t = self.cfg.record_tokens
        n = min(len(ids), len(slots)) // t * t
        if n == 0 or self.cfg.preemption_mode == "recompute":
            return 0
        tiers = [name for name, tier in (("l2", self.l2), ("l3", self.l3)) if tier is not None]
        if self.cfg.load_policy == "faster" and not any(self.costs.cheaper(name) for name in tiers):
            self.swap_out_tokens["skipped"] += n
            return 0
        dropped_before = self.writer.dropped
        self.backup(ids[:n], slots[:n], 0, deadline=time.monotonic() + self.cfg.swap_wait_s)
        dropped = (self.writer.dropped - dropped_before) * t
        self.swap_out_tokens["out"] += n - dropped
        self.swap_out_tokens["dropped"] += dropped
        return n - dropped

    # ------------------------------------------------------------------ loads
    def _worth(self, tier: str) -> bool:
        return self.cfg.load_policy == "always" or self.costs.worth(tier)

    def fetch(self, ids: list[int], start: int, limit: int) -> tuple[int, list[bytes], Optional[bytes]]:
        """Records continuing a match of `start` tokens, up to position `limit`. Returns (p0, payloads, state):
        payloads[j] holds positions p0 + j*T .. p0 + (j+1)*T - 1 (p0 = start rounded down to a record); state:
        a hybrid model's snapshot at the payloads' end (the payloads stop at the deepest one; None otherwise)."""
        t = self.cfg.record_tokens
        p0, end = start // t * t, limit // t * t
        if end - p0 < t or end <= start:
            return p0, [], None
        began = time.monotonic()
        deadline = began + self.cfg.load_timeout_s
        keys = self._keys(ids[:end])
        if keys is None:
            return p0, [], None
        keys = keys[p0 // t:]
        missed = self._recent_misses.get(keys[0])
        if missed is not None and began - missed < MISS_MEMO_S:
            return p0, [], None
        self.lookups += 1
        out: list[bytes] = []
        sources: list[str] = []  # where each record of out came from
        use_l2 = self.l2 is not None and self._worth("l2")
        for key in keys:
            payload, where = self.writer.pending(key), "queue"
            if payload is None and use_l2:
                t0 = time.monotonic()
                payload, where = self.l2.get(key), "l2"
                if payload is not None:
                    self.costs.note_load("l2", t, time.monotonic() - t0)
            if payload is None:
                break
            out.append(payload)
            sources.append(where)
            if time.monotonic() >= deadline:
                break
        use_l3 = self.l3 is not None and len(out) < len(keys) and self._worth("l3")
        while use_l3 and len(out) < len(keys) and time.monotonic() < deadline:
            ask = keys[len(out):len(out) + L3_BATCH]  # MGETs of a few records: stop soon after a miss
            t0 = time.monotonic()
            got = self.l3.get_many(ask)
            self.costs.note_load("l3", t * max(sum(p is not None for p in got), 1), time.monotonic() - t0)
            for key, payload in zip(ask, got):
                if payload is None:
                    break
                out.append(payload)
                sources.append("l3")
                self._know_l3(key)
                if self.l2 is not None:  # promote: the next restart finds it on disk
                    self.writer.submit(key, payload, [self.l2])
            if None in got:
                break
        state = None
        if self.state_port is not None and out:  # a hybrid model continues only from a snapshot
            j, state = self._deepest_state(keys, len(out))
            out, sources = out[:j], sources[:j]
            self.state_records["loaded"] += state is not None
        if not out:
            self._recent_misses[keys[0]] = time.monotonic()
            self._recent_misses.move_to_end(keys[0])
            if len(self._recent_misses) > 4096:
                self._recent_misses.popitem(last=False)
        for j, where in enumerate(sources):  # the first record's tokens before `start` were in L1 already
            self.hit_tokens[where] += t - (start - p0 if j == 0 else 0)
        self.load_seconds += time.monotonic() - began
        return p0, out, state

    def load_into(self, slots: list[int], payloads: list[bytes]) -> None:
        began = time.monotonic()
        self.port.write_records(slots, payloads)
        self.loads += 1
        self.bytes_loaded += sum(len(p) for p in payloads)
        self.load_seconds += time.monotonic() - began

    # ------------------------------------------------------------------ flush / stats / checks
    def clear(self, tiers: tuple[str, ...] = ("l2", "l3")) -> bool:
        """Empty the named tiers (writes still queued are dropped first). False if one could not be reached."""
        self.writer.discard_queued()
        self.writer.drain(timeout_s=10.0)
        ok = True
        if "l2" in tiers and self.l2 is not None:
            self.l2.clear()
        if "l3" in tiers and self.l3 is not None:
            ok = self.l3.clear()
            self._l3_known.clear()
        return ok

    def close(self) -> None:
        self.writer.close()
        if self.l2 is not None:
            self.l2.close()

    def stats(self) -> dict:
        return {
            "record_tokens": self.cfg.record_tokens, "write_policy": self.cfg.write_policy,
            "preemption_mode": self.cfg.preemption_mode,
            "hit_tokens": dict(self.hit_tokens), "lookups": self.lookups, "loads": self.loads,
            "load_seconds": self.load_seconds, "bytes_loaded": self.bytes_loaded, "load_faults": self.load_faults,
            "writer": self.writer.stats(), "costs": self.costs.stats(), "swap_out_tokens": dict(self.swap_out_tokens),
            "state_records": dict(self.state_records),
            "l2": self.l2.stats() if self.l2 is not None else None,
            "l3": self.l3.stats() if self.l3 is not None else None,
        }

    def check_integrity(self, deep: bool = False, l3: bool = False) -> None:
        """L2's invariants (deep: every record's checks too); l3=True: Redis answers (and deep: its records)."""
        if self.l2 is not None:
            self.l2.check_integrity(deep)
        if l3 and self.l3 is not None:
            self.l3.check_integrity(deep)

