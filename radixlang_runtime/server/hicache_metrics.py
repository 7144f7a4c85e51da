"""The hierarchical KV cache's gauges for /metrics (mem/hicache.py stats; refreshed at each scrape).

Per tier (label tier: queue = the writer's queue, l2 = disk, l3 = Redis): tokens served past the L1
match, bytes written, faults (bad records, failed writes, Redis unreachable), occupancy; overall: bytes
loaded into the pool, loads and their total seconds, writes dropped by a full queue. Data parallel:
summed over the replicas. Absent (no samples) without --enable-hierarchical-cache.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Gauge

P = "radixlang:hicache_"


class HiCacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.hit_tokens = Gauge(P + "hit_tokens", "Prompt tokens loaded from a tier (past the L1 match)", ["tier"],
                                registry=r)
        self.bytes_written = Gauge(P + "bytes_written", "Record payload bytes written to a tier", ["tier"], registry=r)
        self.faults = Gauge(P + "faults", "Bad records, failed writes and unreachable-store errors (misses)",
                            ["tier"], registry=r)
        self.used_bytes = Gauge(P + "used_bytes", "Bytes a tier holds (l2: on disk; l3: stored by this server)",
                                ["tier"], registry=r)
        self.bytes_loaded = Gauge(P + "bytes_loaded", "Record bytes loaded into the KV pool", registry=r)
        self.loads = Gauge(P + "loads", "Loads from the tiers into the KV pool", registry=r)
        self.load_seconds = Gauge(P + "load_seconds", "Seconds spent fetching and loading records, all loads",
                                  registry=r)
        self.writes_dropped = Gauge(P + "writes_dropped", "Record writes dropped by a full writer queue", registry=r)

    def render(self, stats: dict[str, Any]) -> None:
        per = [s.get("hicache") for s in stats.get("replicas", [stats])]
        per = [h for h in per if h]
        if not per:
            return
        for tier in ("queue", "l2", "l3"):
            self.hit_tokens.labels(tier).set(sum(h["hit_tokens"][tier] for h in per))
        for tier in ("l2", "l3"):
            self.bytes_written.labels(tier).set(sum(h["writer"]["bytes_written"].get(tier, 0) for h in per))
            self.faults.labels(tier).set(sum((h[tier] or {}).get("faults", 0) for h in per))
        self.used_bytes.labels("l2").set(sum((h["l2"] or {}).get("used_bytes", 0) for h in per))
        self.used_bytes.labels("l3").set(sum((h["l3"] or {}).get("bytes_stored", 0) for h in per))
        self.bytes_loaded.set(sum(h["bytes_loaded"] for h in per))
        self.loads.set(sum(h["loads"] for h in per))
        self.load_seconds.set(sum(h["load_seconds"] for h in per))
        self.writes_dropped.set(sum(h["writer"]["dropped"] for h in per))
