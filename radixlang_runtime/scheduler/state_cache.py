"""Prefix caching of hybrid models' recurrent states (torch-free): which radix nodes hold a state snapshot,
where a match may stop, and which snapshots a step saves and loads.

A hybrid model (model/layers/gated_deltanet.py) continues from a cached prefix only with the recurrent state at the
prefix's end, so a match goes no deeper than the deepest node on its path holding a snapshot (the K/V below
it is cached for others but recomputed here). Snapshots are taken where the scheduler runs a prefill step:
at the last page boundary of each extend (the end of each prefill chunk and, page-aligned, of each prompt),
into a snapshot slot (mem/state_slots.py) that the step's result attaches to the node ending there; and where
a decode step ends on a page boundary, into one slot per decoding request (each boundary overwrites the last),
attached when the request finishes: a follow-up turn extending the conversation continues from the finished
turn's last page boundary instead of its prompt's. A decode row verifying a draft (jump-forward, n-gram) saves
only where its own token ends on a page boundary, never inside the draft: a snapshot never holds a draft token
the model may reject (mem/verify_states.py rolls the request's slot back). They
leave with their node (the radix LRU evicts K/V and snapshot together) or alone when snapshot slots run
short (least recently used unlocked nodes first); a locked node keeps its snapshot.
"""

from __future__ import annotations

from typing import Optional

from radixlang_runtime.mem.radix_cache import MatchResult, RadixCache
from radixlang_runtime.mem.state_slots import StateSlots
from radixlang_runtime.scheduler.request import Req


class StateCache:
    def __init__(self, radix: RadixCache, slots: StateSlots):
        self.radix = radix
        self.slots = slots
        self.snapshots_taken = 0
        self.snapshot_hits = 0
        self.splits = 0  # snapshots saved at a prefill chunk ended where prompts diverge (Req.state_split)

    def truncate_match(self, m: MatchResult) -> MatchResult:
        """m cut back to the deepest node of its path holding a snapshot (unlocked yet)."""
        node, depth = self.radix.state_ancestor(m.last_node)
        return MatchResult(depth, m.slots[:depth], node)

    def split_at(self, cached_len: int, held_len: int, target_len: int) -> int:
        """Where a prompt whose K/V matched cached_len tokens (page-aligned: where it leaves the cached path) but
        whose state continues only from held_len should end a prefill chunk to snapshot the state there, so
        that the next prompt sharing that prefix continues from it; 0 when its prompt-end snapshot serves
        (the divergence is its own last page boundary) or a snapshot is held there already."""
        if held_len < cached_len < target_len // self.radix.page_size * self.radix.page_size:
            return cached_len
        return 0

    def load(self, payload: Optional[bytes], port) -> Optional[int]:
        """A snapshot the hierarchical cache's tiers gave (mem/hicache.py fetch) written into a fresh snapshot
        slot (None: no payload, no slot, or it does not fit this pool: the load is a miss)."""
        if payload is None:
            return None
        slot = self._alloc()
        if slot is None:
            return None
        try:
            port.write_state(slot, payload)
        except ValueError:
            self.slots.free([slot])
            return None
        return slot

    def adopt(self, req: Req, node, slot: int) -> None:
        """After a load from the tiers ending at node (locked): the loaded snapshot becomes node's (unless
        it holds one already: then that one serves and the copy is freed), and req continues from it."""
        if node.state is None:
            node.state = slot
        else:
            self.slots.free([slot])
        if req.state_load is None:
            self.snapshot_hits += 1
        req.state_load = node.state
        req.state_split = 0

    def note_match(self, req: Req, m: MatchResult) -> None:
        req.state_load = m.last_node.state if m.length else None
        self.snapshot_hits += bool(m.length)

    def plan(self, reqs: list[Req], prefix_lens: list[int], extend_lens: list[int], prefill_count: int,
             page_size: int) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
        """The step's (snapshot slot -> request slot) loads and (request index, offset, snapshot slot) saves: for
        its first prefill_count requests at their extend's last page boundary, for the rest (decode rows) where
        their own token (before any draft) ends on one."""
        loads, saves = [], []
        for i in range(prefill_count):
            req, p = reqs[i], prefix_lens[i]
            if req.state_load is not None:
                loads.append((req.state_load, req.table_idx))
                req.state_load = None
            pos = (p + extend_lens[i]) // page_size * page_size
            if pos <= p or req.pending_state is not None:
                continue
            slot = self._alloc()
            if slot is None:
                continue
            req.pending_state = (slot, pos)
            saves.append((i, pos - p, slot))
            self.snapshots_taken += 1
            self.splits += pos == req.state_split
        for i in range(prefill_count, len(reqs)):  # a draft's tokens may be rejected: a save stops before them
            kept = extend_lens[i] - len(reqs[i].draft)
            self._plan_decode(reqs[i], i, prefix_lens[i] + kept, kept, page_size, saves)
        return loads, saves

    def _plan_decode(self, req: Req, i: int, end: int, n: int, page_size: int, saves: list) -> None:
        """A decode row whose step ends on a page boundary saves its state there: into the slot its previous
        boundary took (not attached yet: decoded tokens enter the tree when the request leaves), else a new
        one. The request's finish (or retraction) attaches it to the node ending there (release)."""
        if end % page_size:
            return
        if req.pending_state is not None:
            slot = req.pending_state[0]
        else:
            slot = self._alloc()
            if slot is None:
                return
            self.snapshots_taken += 1
        req.pending_state = (slot, end)
        saves.append((i, n, slot))

    def _alloc(self) -> Optional[int]:
        slot = self.slots.alloc()
        if slot is None:
            self.slots.free(self.radix.drop_states(1))
            slot = self.slots.alloc()
        return slot

    def attach(self, req: Req, cache_ids: list[int], cached: bool) -> None:
        """After the step that saved req's state (and the insert of what it computed): the snapshot goes to the
        node ending at its position, or back to the free list (not cached, or that node holds one already)."""
        if req.pending_state is None:
            return
        slot, pos = req.pending_state
        req.pending_state = None
        if cached:
            m = self.radix.match_prefix(cache_ids[:pos])
            if m.length == pos and m.last_node.state is None:
                m.last_node.state = slot
                return
        self.slots.free([slot])

    def forget(self, req: Req) -> None:
        """req leaves (released, unmatched): its pending snapshot slot is freed, its load dropped."""
        req.state_load = None
        if req.pending_state is not None:
            self.slots.free([req.pending_state[0]])
            req.pending_state = None

    def reclaim(self) -> None:
        """Snapshot slots of nodes the radix cache dropped (evict, reset) back to the free list."""
        if self.radix.freed_states:
            self.slots.free(self.radix.freed_states)
            self.radix.freed_states = []

    def check_integrity(self, live: list[Req]) -> None:
        pending = [r.pending_state[0] for r in live if r.pending_state is not None]
        self.slots.check_integrity(self.radix.held_states() + pending)

    def stats(self) -> dict:
        return {"snapshot_slots": self.slots.count, "snapshot_slots_free": self.slots.free_count,
                "snapshots_held": len(self.radix.held_states()), "snapshots_taken": self.snapshots_taken,
                "snapshot_hits": self.snapshot_hits, "snapshot_splits": self.splits}
