"""The hierarchical KV cache's gauges for /metrics (mem/hicache.py stats; refreshed at each scrape).

Per tier (label tier: queue = the writer's queue, l2 = disk, l3 = Redis): tokens served past the L1
match, bytes written, faults (bad records, failed writes, Redis unreachable), occupancy; overall: bytes
loaded into the pool, loads and their total seconds, writes dropped by a full queue; retracted requests'
tokens swapped out at retraction and, at readmission, kept in L1 / swapped back in / recomputed. Data
parallel: summed over the replicas. Absent (no samples) without --enable-hierarchical-cache.
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
        self.swap_out_tokens = Gauge(P + "swap_out_tokens", "Retracted requests' tokens swapped out to the tiers "
                                     "(out), not swapped as recomputing is cheaper (skipped), or dropped", ["kind"],
                                     registry=r)
        self.readmit_tokens = Gauge(P + "readmit_tokens", "Retracted requests' K/V at readmission: still in L1 "
                                    "(kept), loaded from the tiers (swapped) or recomputed", ["source"], registry=r)

    def render(self, stats: dict[str, Any]) -> None:
        replicas = [s for s in stats.get("replicas", [stats]) if s.get("hicache")]
        per = [s["hicache"] for s in replicas]
        if not per:
            return
        for kind in ("out", "skipped", "dropped"):
            self.swap_out_tokens.labels(kind).set(sum(h.get("swap_out_tokens", {}).get(kind, 0) for h in per))
        for source in ("kept", "swapped", "recomputed"):
            self.readmit_tokens.labels(source).set(sum(s.get("readmit_tokens", {}).get(source, 0) for s in replicas))
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
