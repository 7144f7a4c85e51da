"""Who owns which KV slot (torch-free): requests, the radix cache, or the free list.

KVManager joins the PageAllocator, the request-table rows and (unless --disable-radix-cache) the
RadixCache, and moves slots between them at each point of a request's life:
- admission: `match` the longest cached prefix (always leaving one token to compute), lock it;
- growth: `alloc` new slots, evicting least-recently-used unlocked cache entries when short;
- after each prefill step: `cache_unfinished` inserts what the request has computed so that others
  can share it, and swaps the request's duplicate slots for the tree's;
- finish, abort, retract: `release` inserts the request's tokens (cache=True) and unlocks; a retraction
  first `swap_out`s the request's whole records to the hicache tiers (when there are tiers).
Prefix pins (the DSL's run_batch keeps its shared prefix for the batch): `pin` locks the longest
cached page-aligned prefix of some token ids so that `evict` cannot take it, `unpin` releases it.
A pin only locks what is cached (the caller prefills first); the pins together lock at most
max_pinned_fraction of the pool (a longer prefix is pinned in part) so requests keep room. A pin
with a ttl expires at the first `expire_pins` after it (the loop calls it every iteration). flush
refuses while anything is locked, pins included (as SGLang: unpin first).
With a HiCache (--enable-hierarchical-cache, mem/hicache.py) the tree has tiers under it: evicted
nodes (and with write_through every insert) are backed up to L2 / L3, and `match` continues an L1
match through the tiers, loading hits into fresh slots that join the tree before the lock is taken.
Invariant (check_integrity): every page is exactly one of free / in the tree / owned by one live
request (kv_indices[tree_len:]), and the tree's evictable + protected sizes add up to its size;
every node's lock_ref counts exactly the live requests' and the pins' locks through it.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Iterable, Optional, Union

from radixlang_runtime.protocol.limits import MAX_PIN_TTL_S
from radixlang_runtime.mem.allocator import PageAllocator
from radixlang_runtime.mem.hicache import HiCache
from radixlang_runtime.mem.null_cache import NullPrefixCache
from radixlang_runtime.mem.radix_cache import MatchResult, RadixCache, TreeNode
from radixlang_runtime.mem.table import TableManager
from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.scheduler.state_cache import StateCache

logger = logging.getLogger(__name__)


@dataclass
class Pin:
    node: Optional[TreeNode]  # locked once for this pin (None: nothing was cached, nothing locked)
    length: int  # pinned tokens, page-aligned: the path root .. node
    expires_at: Optional[float]  # time.monotonic() deadline; None: until unpin
    owner: str = ""  # who may unpin it (services.pin_owner: the creator's API key's digest; "": anyone)


class KVManager:
    def __init__(self, allocator: PageAllocator, table: TableManager, radix: Union[RadixCache, NullPrefixCache],
                 max_pinned_fraction: float = 0.5, hicache: Optional[HiCache] = None,
                 states: Optional[StateCache] = None):
        """states: a hybrid model's state snapshots (scheduler/state_cache.py): matches stop where one is held."""
        if radix.page_size != allocator.page_size:
            raise ValueError("the radix cache and the allocator must use the same page size")
        if not 0.0 <= max_pinned_fraction <= 1.0:
            raise ValueError(f"max_pinned_fraction must be in [0, 1], got {max_pinned_fraction}")
        self.allocator = allocator
        self.table = table
        self.radix = radix
        self.page_size = allocator.page_size
        self.pins: dict[str, Pin] = {}
        self.max_pinned_slots = int(allocator.total_slots * max_pinned_fraction)
        self.hicache = hicache if radix.shares else None
        self.states = states if radix.shares else None
        if self.hicache is not None:
            if self.hicache.cfg.record_tokens % self.page_size:
                raise ValueError("hicache records must hold a whole number of pages")
            radix.on_evict = self._backup_evicted

    # ------------------------------------------------------------------ sizes
    def evictable_size(self) -> int:
        return self.radix.evictable_size()

    def cached_size(self) -> int:
        return self.radix.total_size()

    def available_size(self) -> int:
        """Slots a request could get now: free pages plus what eviction can free."""
        return self.allocator.available_size() + self.evictable_size()

    # ------------------------------------------------------------------ admission
    def match(self, req: Req, target_len: int) -> int:
        """Give a request that holds nothing the cached prefix of fill_ids[:target_len - 1] (at least one
        token stays to compute) and lock it. Returns how many evictable slots the lock protected (the
        caller's KV budget shrinks by that much)."""
        req.tier_len = 0
        if req.kv_indices or target_len <= 1:
            return 0
        before = self.available_size()
        limit = target_len - 1
        if req.wants_input_logprobs:  # positions >= logprob_start_len need their logits: compute them
            limit = min(limit, req.logprob_start_len)
        if req.pooled is not None and req.pooled.spec.needs_all_positions:  # mean / cls read every position
            limit = 0
        if req.return_hidden_states:  # only the positions whose hidden states it holds (hidden_states.py)
            limit = min(limit, len(req.hidden_rows))
        m = self.radix.match_prefix(req.cache_ids[:limit])
        if self.states is not None:
            full, m = m, self.states.truncate_match(m)
            self.states.note_match(req, m)
            req.state_split = self.states.split_at(full.length, m.length, target_len)
        if m.length:
            self.radix.lock(m.last_node)
        if self.hicache is not None:
            l1_len = m.length
            m = self._load_from_tiers(req, limit, m)
            req.tier_len = m.length - l1_len
        if m.length == 0:
            return 0
        req.kv_indices, req.tree_len, req.last_node, req.row_dirty = list(m.slots), m.length, m.last_node, True
        # the lock protected evictable slots; loaded records took free ones (and stay locked)
        return before - self.available_size()

    def _load_from_tiers(self, req: Req, limit: int, m: MatchResult) -> MatchResult:
        """Continue the (locked) L1 match m through the tiers: load the records found into fresh slots,
        insert them into the tree and move the lock to the longer match. A failed load is a miss. A hybrid
        model's load ends at the deepest record end with a state snapshot in the tiers, which is restored into
        a snapshot slot of that node and loaded into the request's state (state_cache.adopt)."""
        ids = req.cache_ids
        t = self.hicache.cfg.record_tokens
        room = (self.allocator.available_size() + self.radix.evictable_size()) // t * t  # tokens placeable
        # fetch only what the pool can take (records fetched and dropped would be read and checked for nothing)
        p0, payloads, state = self.hicache.fetch(ids, m.length, min(limit, m.length // t * t + room))
        if not payloads:
            return m
        snapshot = None
        if self.states is not None:  # a hybrid model's snapshot at the records' end (the fetch stopped there)
            snapshot = self.states.load(state, self.hicache.state_port)
            if snapshot is None:
                return m
        n = len(payloads) * t
        self.ensure_free(n)
        slots = self.allocator.alloc_extend(-1, p0, n)  # p0 is page-aligned: whole fresh pages
        try:
            self.hicache.load_into(slots, payloads)
        except Exception as e:  # noqa: BLE001 - a load that fails is a miss; the request recomputes
            self.hicache.load_faults += 1
            logger.warning("hicache: loading %d records failed (%s: %s): a miss", len(payloads), type(e).__name__, e)
            self.allocator.free(slots)
            if snapshot is not None:
                self.states.slots.free([snapshot])
            return m
        already = self.radix.insert(ids[:p0 + n], m.slots[:p0] + slots)
        if already > p0:  # positions p0 .. already-1 were in L1 (the first record's overlap)
            self.allocator.free(slots[:already - p0])
        m2 = self.radix.match_prefix(ids[:p0 + n])
        if m2.length != p0 + n:
            raise AssertionError(f"radix: loaded {p0 + n} tokens but matched {m2.length}")
        self.radix.lock(m2.last_node)
        if m.length:
            self.radix.unlock(m.last_node)
        if snapshot is not None:
            self.states.adopt(req, m2.last_node, snapshot)
        return m2

    def note_prefill(self, tokens: int, seconds: float) -> None:
        """A prefill step's cost: what a tier's load is weighed against (mem/tier_costs.py)."""
        if self.hicache is not None:
            self.hicache.costs.note_prefill(tokens, seconds)

    def _backup_evicted(self, node: TreeNode) -> None:
        """RadixCache.on_evict: the node's records go to the tiers (skipped where they are already)."""
        ids, slots = self.radix.path_to(node)
        self.hicache.backup(ids, slots, len(ids) - len(node.key))
        if node.state is not None:  # a hybrid model's snapshot goes with the K/V
            self.hicache.backup_state(ids, node.state)

    def swap_out(self, req: Req) -> int:
        """retract_decode, before `release`: the request's whole records to the tiers (mem/hicache.swap_out),
        so that readmission loads them if eviction takes them from L1. Returns the tokens swapped out."""
        if self.hicache is None:
            return 0
        return self.hicache.swap_out(req.cache_ids[:req.kv_len], req.kv_indices)

    def unmatch(self, req: Req) -> None:
        """Undo `match` for a request that was not admitted after all."""
        if req.last_node is not None:
            self.radix.unlock(req.last_node)
        req.kv_indices, req.tree_len, req.last_node = [], 0, None
        if self.states is not None:
            self.states.forget(req)

    def assign_row(self, req: Req) -> None:
        if req.table_idx < 0:
            req.table_idx = self.table.allocate()

    # ------------------------------------------------------------------ growth
    def ensure_free(self, num_slots: int) -> None:
        """Evict from the tree until num_slots slots are free (or nothing evictable is left)."""
        short = num_slots - self.allocator.available_size()
        if short > 0:
            self.allocator.free(self.radix.evict(short))
            if self.states is not None:
                self.states.reclaim()

    def alloc(self, req: Req, n: int) -> list[int]:
        """Slots for positions kv_len .. kv_len+n-1 of req (appended to req.kv_indices)."""
        self.ensure_free(self.allocator.slots_needed(req.kv_len, n))
        last = req.kv_indices[-1] if req.kv_indices else -1
        slots = self.allocator.alloc_extend(last, req.kv_len, n)
        req.kv_indices.extend(slots)
        return slots

    def truncate(self, req: Req, new_len: int) -> None:
        """Drop positions new_len.. of req (K/V of draft tokens the model rejected). Whole pages past
        the page of position new_len - 1 are freed; a partly used page stays with req (a position has
        a fixed offset in its page, so the next alloc continues in it). new_len >= tree_len."""
        assert req.tree_len <= new_len <= req.kv_len
        keep = -(-new_len // self.page_size) * self.page_size  # positions < keep lie in req's kept pages
        if len(req.kv_indices) > keep:
            self.allocator.free(req.kv_indices[keep:])
        del req.kv_indices[new_len:]

    # ------------------------------------------------------------------ caching
    def _insert(self, req: Req) -> int:
        """Insert the page-aligned part of what req has computed; free the request's own slots the tree
        already held (positions tree_len .. already-1). Returns the aligned length inserted."""
        aligned = req.kv_len // self.page_size * self.page_size
        if aligned <= req.tree_len:
            return req.tree_len
        already = self.radix.insert(req.cache_ids[:aligned], req.kv_indices[:aligned])
        if self.hicache is not None and self.hicache.write_through:  # before the duplicates are freed
            self.hicache.backup(req.cache_ids[:aligned], req.kv_indices[:aligned], already)
        if already > req.tree_len:
            self.allocator.free(req.kv_indices[req.tree_len:already])
        return aligned

    def cache_unfinished(self, req: Req) -> None:
        """After a prefill step of a request that goes on: share its computed tokens now. Its duplicate
        slots (another request stored the same tokens meanwhile) are swapped for the tree's copies."""
        if not self.radix.shares:
            return
        old_tree_len = req.tree_len
        aligned = self._insert(req)
        if self.states is not None:
            self.states.attach(req, req.cache_ids, cached=True)
        if aligned == old_tree_len:
            return
        m = self.radix.match_prefix(req.cache_ids[:aligned])
        if m.length != aligned:
            raise AssertionError(f"radix: inserted {aligned} tokens but matched {m.length}")
        if req.kv_indices[:aligned] != m.slots:
            req.kv_indices[:aligned] = m.slots
            req.row_dirty = True
        self.radix.lock(m.last_node)
        if req.last_node is not None:
            self.radix.unlock(req.last_node)
        req.tree_len, req.last_node = aligned, m.last_node

    def release(self, req: Req, cache: bool = True) -> None:
        """Give back everything req holds. cache=True stores its computed tokens in the tree first
        (finish, abort, retract); cache=False (a failed step: the K/V may be garbage) only frees."""
        if cache and self.radix.shares:
            keep = self._insert(req)
        else:
            keep = req.tree_len
        if self.states is not None:
            self.states.attach(req, req.cache_ids, cached=cache)
            self.states.forget(req)
        if len(req.kv_indices) > keep:
            self.allocator.free(req.kv_indices[keep:])
        if req.last_node is not None:
            self.radix.unlock(req.last_node)
        req.kv_indices, req.tree_len, req.last_node, req.row_dirty = [], 0, None, False
        if req.table_idx >= 0:
            self.table.free(req.table_idx)
            req.table_idx = -1

    # ------------------------------------------------------------------ prefix pins
    def pin(self, token_ids: list[int], ttl_s: Optional[float] = None,
            now: Optional[float] = None, owner: str = "") -> tuple[str, int]:
        """Lock the longest cached page-aligned prefix of token_ids until `unpin` (or ttl_s seconds).
        Returns (pin_id, pinned_len); pinned_len is 0 when nothing is cached (the pin still exists)
        and shorter than the cached prefix when the pins' cap (max_pinned_slots) is reached. The id is
        unguessable (128 random bits); only `owner` may unpin it."""
        if ttl_s is not None and (isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float))
                                  or not 0 < ttl_s <= MAX_PIN_TTL_S):
            raise ValueError(f"ttl_s must be a positive number of seconds up to {MAX_PIN_TTL_S:g}, got {ttl_s!r}")
        node, length = None, 0
        m = self.radix.match_prefix(token_ids)
        length = self._capped_pin_len(m.last_node)
        if length < m.length:
            m = self.radix.match_prefix(token_ids[:length])  # splits the edge at the cap
        if m.length:
            node, length = m.last_node, m.length
            self.radix.lock(node)
        pin_id = f"pin-{secrets.token_hex(16)}"
        expires = None if ttl_s is None else (time.monotonic() if now is None else now) + ttl_s
        self.pins[pin_id] = Pin(node, length, expires, owner)
        return pin_id, length

    def _capped_pin_len(self, last: TreeNode) -> int:
        """How much of the path root .. last a new pin may lock: nodes already pinned are free of
        charge, the rest counts against max_pinned_slots - pinned_slots()."""
        path = []
        while last is not None and last is not self.radix.root:
            path.append(last)
            last = last.parent
        pinned = self._pinned_nodes()
        room = max(self.max_pinned_slots - sum(len(n.key) for n in pinned.values()), 0)
        length = 0
        for node in reversed(path):
            cost = 0 if id(node) in pinned else len(node.key)
            if cost > room:
                return length + room // self.page_size * self.page_size
            room -= cost
            length += len(node.key)
        return length

    def _pinned_nodes(self) -> dict[int, TreeNode]:
        out: dict[int, TreeNode] = {}
        for p in self.pins.values():
            node = p.node
            while node is not None and node is not self.radix.root and id(node) not in out:
                out[id(node)] = node
                node = node.parent
        return out

    def unpin(self, pin_id: str, owner: str = "") -> bool:
        """Release a pin; False when there is no such pin of owner's (unknown, already unpinned, expired, or
        another owner's: told apart from unknown to nobody)."""
        p = self.pins.get(pin_id)
        if p is None or not hmac.compare_digest(p.owner, owner):
            return False
        del self.pins[pin_id]
        if p.node is not None:
            self.radix.unlock(p.node)
        return True

    def expire_pins(self, now: Optional[float] = None) -> list[str]:
        """Drop the pins whose ttl has passed; returns their ids."""
        if not self.pins:
            return []
        now = time.monotonic() if now is None else now
        gone = [pid for pid, p in self.pins.items() if p.expires_at is not None and p.expires_at <= now]
        for pid in gone:
            self.unpin(pid)
        return gone

    def pinned_slots(self) -> int:
        """Distinct slots the pins lock (overlapping pins count once)."""
        return sum(len(n.key) for n in self._pinned_nodes().values())

    def pin_stats(self) -> dict[str, int]:
        return {"pinned_slots": self.pinned_slots(), "num_pins": len(self.pins)}

    def flush(self, tiers: Optional[Iterable[str]] = None) -> bool:
        """Empty the tree (and the hicache tiers named; None: every tier). Only when nothing holds any of
        it: no request (the caller checks it is idle) and no pin (a pinned prefix is locked: flush
        refuses until it is unpinned or expires). False also when a tier could not be reached."""
        tiers = ("l1", "l2", "l3") if tiers is None else tuple(tiers)
        if "l1" in tiers:
            if self.radix.protected_size():
                return False
            self.allocator.free(self.radix.reset())
            if self.states is not None:
                self.states.reclaim()
        if self.hicache is not None and ("l2" in tiers or "l3" in tiers):
            return self.hicache.clear(tiers)
        return True

    def close_tiers(self, timeout_s: float = 30.0) -> None:
        """Shutdown: write_back stores what only L1 holds (every leaf's path, a hybrid model's snapshots), the
        writer drains (bounded)."""
        if self.hicache is None:
            return
        deadline = time.monotonic() + timeout_s
        if not self.hicache.write_through:
            for node in self.radix._leaves():
                ids, slots = self.radix.path_to(node)
                self.hicache.backup(ids, slots, 0, deadline)
            if self.states is not None:  # and a hybrid model's snapshots with them
                for node in [n for n in self.radix._nodes() if n.state is not None]:
                    self.hicache.backup_state(self.radix.path_to(node)[0], node.state, deadline)
        self.hicache.writer.drain(max(deadline - time.monotonic(), 0.0))
        self.hicache.close()

    # ------------------------------------------------------------------ checks
    def check_integrity(self, live: Iterable[Req]) -> None:
        """Every page: free, in the tree, or owned by exactly one live request; rows likewise."""
        live = list(live)
        ps = self.page_size
        owners: dict[int, str] = {p: "free" for p in self.allocator.free_page_ids()}
        if len(owners) != self.allocator.free_pages:
            raise AssertionError("allocator: a page is on the free list twice")

        def claim(slots: Iterable[int], who: str) -> None:
            for page in {s // ps for s in slots}:
                if page in owners:
                    raise AssertionError(f"page {page} owned by {who} and {owners[page]}")
                owners[page] = who

        self.radix.check_integrity()
        holders = [r.last_node for r in live if r.last_node is not None]
        self.radix.check_locks(holders + [p.node for p in self.pins.values() if p.node is not None])
        claim(self.radix.all_slots(), "the radix cache")
        for r in live:
            if r.tree_len % ps or (r.tree_len and r.last_node is None):
                raise AssertionError(f"request {r.rid}: tree_len {r.tree_len} without an aligned locked node")
            claim(r.kv_indices[r.tree_len:], f"request {r.rid}")
        if len(owners) != self.allocator.num_pages:
            raise AssertionError(f"{self.allocator.num_pages - len(owners)} pages are neither free, cached nor held")
        self.allocator.check_integrity()
        if self.hicache is not None:
            self.hicache.check_integrity()
        if self.states is not None:
            self.states.check_integrity(live)
        self.table.check_integrity(rows_in_use=sum(1 for r in live if r.table_idx >= 0))
