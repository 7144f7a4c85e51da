"""What the live view (/dashboard) shows of the scheduler: queues, the KV pool split, the radix tree
summary. Called on the scheduler's thread between steps (through a GetStatsReq with
detail="dashboard"), so it never races a step; it never blocks one either (it runs in the loop's
intake, like every stats request).

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
                "evicted_tokens_total": kv.radix.evicted_tokens_total if kv.radix is not None else 0}
        return {"queues": queues, "kv": pool, "tree": self._tree_summary(s, with_ids),
                "prefill_tokens_computed": s.admission.prefill_tokens_computed,
                "prefill_tokens_cached": s.admission.prefill_tokens_cached}

    def _tree_summary(self, s: Scheduler, with_ids: bool) -> dict[str, Any] | None:
        radix = s.kv.radix
        if radix is None:
            return None
        now = time.monotonic()
        key = (with_ids, radix.clock_now())
        if self._tree is None or (key != self._tree_key and now - self._tree_at >= TREE_REFRESH_S):
            pinned = frozenset(id(p.node) for p in s.kv.pins.values() if p.node is not None)
            self._tree = summarize_tree(radix, MAX_TREE_NODES, with_ids, pinned)
            self._tree_key, self._tree_at = key, now
        return self._tree
