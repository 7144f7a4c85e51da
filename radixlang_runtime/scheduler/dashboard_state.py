"""What the live view (/dashboard) shows of the scheduler: queues, the KV pool split, the radix tree
summary, the cache tiers (L1 = the pool's radix cache, then with --enable-hierarchical-cache the writer's
queue, L2 disk, L3 Redis: hit tokens, occupancy, writes, loads, faults), speculation (drafted / accepted
tokens, the accept-length histogram). Called on the scheduler's
thread between steps (through a GetStatsReq with detail="dashboard"), so it never races a step; it never
blocks one either (it runs in the loop's intake, like every stats request).

Cost bound: the tree summary walks the whole tree, in CPython too slow to redo on every poll of a large
tree (docs/PERFORMANCE.md#dashboard), so it is recomputed at most every TREE_REFRESH_S; queue and pool
figures are fresh on every call.
KV split (slots): free + evictable (cached, unlocked) + locked (cached, in use by a request or a pin)
+ private (held by requests, not in the tree) == total.
"""

from __future__ import annotations

import time
from typing import Any

from radixlang_runtime.mem.radix_summary import summarize_tree
from radixlang_runtime.scheduler.scheduler import Scheduler

TREE_REFRESH_S = 1.0
MAX_TREE_NODES = 300


class DashboardState:
    def __init__(self) -> None:
        self._tree: dict[str, Any] | None = None
        self._tree_key: tuple[bool, int] | None = None
        self._tree_at = 0.0

    def collect(self, s: Scheduler, with_ids: bool) -> dict[str, Any]:
        kv = s.kv
        total = kv.allocator.total_slots
        free = kv.allocator.available_size()
        cached = kv.cached_size()
        evictable = kv.evictable_size()
        queues = {
            "waiting": len(s.waiting), "running": len(s.running), "chunked": 1 if s.chunked_req else 0,
            "grammar_waiting": len(s.grammar.pending) if s.grammar is not None else 0,
            "retracted_total": s.num_retracted_total, "last_stop_reason": s.admission.last_stop_reason,
            "forward_steps": s.forward_steps,
        }
        pool = {"total": total, "free": free, "evictable": evictable, "locked": cached - evictable,
                "private": total - free - cached, **kv.pin_stats(),
                "evicted_tokens_total": kv.radix.evicted_tokens_total}
        return {"queues": queues, "kv": pool, "tree": self._tree_summary(s, with_ids),
                "prefill_tokens_computed": s.admission.prefill_tokens_computed,
                "prefill_tokens_cached": s.admission.prefill_tokens_cached, "tiers": tier_view(s),
                "spec": spec_view(s)}

    def _tree_summary(self, s: Scheduler, with_ids: bool) -> dict[str, Any] | None:
        radix = s.kv.radix
        if not radix.shares:
            return None
        now = time.monotonic()
        key = (with_ids, radix.clock_now())
        if self._tree is None or (key != self._tree_key and now - self._tree_at >= TREE_REFRESH_S):
            pinned = frozenset(id(p.node) for p in s.kv.pins.values() if p.node is not None)
            self._tree = summarize_tree(radix, MAX_TREE_NODES, with_ids, pinned)
            self._tree_key, self._tree_at = key, now
        return self._tree


def spec_view(s: Scheduler) -> dict[str, Any]:
    """Speculation: the drafter (NGRAM / STANDALONE; None without), its draft / accepted token totals and the
    accept-length histogram; jump-forward's forced tokens (constrained requests) beside them."""
    d = s.drafts.drafter
    return {"algorithm": d.name if d is not None else None,
            "draft_tokens": s.drafts.spec_draft_tokens, "accepted_tokens": s.drafts.spec_accepted_tokens,
            "accept_length": d.accept_stats.to_dict() if d is not None else None,
            "forced_tokens": s.grammar.forced_tokens_total if s.grammar is not None else 0}


def tier_view(s: Scheduler) -> dict[str, Any]:
    """One row per cache tier: hit tokens (L1: prompt tokens the radix cache served, tiers included once
    loaded; below: tokens each tier loaded past the L1 match), used / capacity (L1 in slots, L2 / L3 in
    bytes; L3's capacity is Redis's own), records written to it, loads into the pool, faults. Plus
    retracted requests' tokens at readmission (kept / swapped / recomputed)."""
    kv = s.kv
    l1 = {"hit_tokens": s.admission.prefill_tokens_cached, "used": kv.cached_size(),
          "capacity": kv.allocator.total_slots, "unit": "slots"}
    out: dict[str, Any] = {"enabled": kv.hicache is not None, "l1": l1,
                           "readmit_tokens": dict(s.admission.readmit_tokens)}
    hc = kv.hicache
    if hc is None:
        return out
    st = hc.stats()
    w = st["writer"]
    out["queue"] = {"hit_tokens": st["hit_tokens"]["queue"], "queued": w["queued"], "dropped": w["dropped"]}
    for name in ("l2", "l3"):
        tier = st[name]
        if tier is None:
            out[name] = None
            continue
        out[name] = {"hit_tokens": st["hit_tokens"][name], "written": w["written"].get(name, 0),
                     "bytes_written": w["bytes_written"].get(name, 0), "faults": tier["faults"], "unit": "bytes",
                     "used": tier.get("used_bytes", tier.get("bytes_stored", 0)),
                     "capacity": tier.get("capacity_bytes"), "skipped": st["costs"]["skipped"][name]}
    out.update(loads=st["loads"], bytes_loaded=st["bytes_loaded"], load_seconds=st["load_seconds"],
               swap_out_tokens=st["swap_out_tokens"])
    return out
