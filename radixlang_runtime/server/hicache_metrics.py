"""The hierarchical KV cache's gauges for /metrics (mem/hicache.py stats; refreshed at each scrape).

Per tier (label tier: queue = the writer's queue, l2 = disk, l3 = Redis): tokens served past the L1
match, bytes written, faults (bad records, failed writes, Redis unreachable) and of them the records refused
for a bad MAC (auth_faults), occupancy; overall: bytes
loaded into the pool, loads and their total seconds, writes dropped by a full queue; retracted requests'
tokens swapped out at retraction and, at readmission, kept in L1 / swapped back in / recomputed. Data
parallel: `merge_hicache_stats` folds the replicas' stats (the TokenizerManager's merged stats["hicache"]),
the gauges read that, and hit tokens also per replica (label replica). Absent (no samples) without
--enable-hierarchical-cache.
"""

from __future__ import annotations

from typing import Any, Optional

from prometheus_client import CollectorRegistry, Gauge

P = "radixlang:hicache_"
_SAME = {"record_tokens", "write_policy", "ttl_s", "preemption_mode"}  # settings: equal on every replica, taken once


def merge_counters(values: list[Any], key: str = "", mean: bool = False) -> Any:
    """Replicas' stats (same shape) folded into one: counters and sizes summed (each replica has its own
    L2 directory, so capacities add up too), per-token costs (*_s_per_token) averaged over the replicas
    that measured them, flags (available) true only when true on all, settings taken once; None skipped."""
    vs = [v for v in values if v is not None]
    if not vs:
        return None
    mean = mean or key.endswith("_s_per_token")
    first = vs[0]
    if isinstance(first, dict):
        keys = dict.fromkeys(k for v in vs for k in v)
        return {k: merge_counters([v.get(k) for v in vs], k, mean) for k in keys}
    if isinstance(first, bool):
        return all(vs)
    if key in _SAME or not isinstance(first, (int, float)):
        return first
    return sum(vs) / len(vs) if mean else sum(vs)


def merge_hicache_stats(per_replica: list[Optional[dict]]) -> Optional[dict]:
    """stats["hicache"] over data-parallel replicas (each replica's own stays in stats["replicas"][i])."""
    merged = merge_counters(per_replica)
    if merged is not None:
        merged["replicas"] = sum(h is not None for h in per_replica)
    return merged


class HiCacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.hit_tokens = Gauge(P + "hit_tokens", "Prompt tokens loaded from a tier (past the L1 match)", ["tier"],
                                registry=r)
        self.bytes_written = Gauge(P + "bytes_written", "Record payload bytes written to a tier", ["tier"], registry=r)
        self.faults = Gauge(P + "faults", "Bad records, failed writes and unreachable-store errors (misses)",
                            ["tier"], registry=r)
        self.auth_faults = Gauge(P + "auth_faults", "Records refused for a bad MAC (forged, or another key's; "
                                 "also in faults)", ["tier"], registry=r)
        self.used_bytes = Gauge(P + "used_bytes", "Bytes a tier holds (l2: on disk; l3: stored by this server)",
                                ["tier"], registry=r)
        self.bytes_loaded = Gauge(P + "bytes_loaded", "Record bytes loaded into the KV pool", registry=r)
        self.loads = Gauge(P + "loads", "Loads from the tiers into the KV pool", registry=r)
        self.load_seconds = Gauge(P + "load_seconds", "Seconds spent fetching and loading records, all loads",
                                  registry=r)
        self.writes_dropped = Gauge(P + "writes_dropped", "Record writes dropped by a full writer queue", registry=r)
        self.replica_hit_tokens = Gauge(P + "replica_hit_tokens", "hit_tokens of one data-parallel replica",
                                        ["replica", "tier"], registry=r)
        self.swap_out_tokens = Gauge(P + "swap_out_tokens", "Retracted requests' tokens swapped out to the tiers "
                                     "(out), not swapped as recomputing is cheaper (skipped), or dropped", ["kind"],
                                     registry=r)
        self.readmit_tokens = Gauge(P + "readmit_tokens", "Retracted requests' K/V at readmission: still in L1 "
                                    "(kept), loaded from the tiers (swapped) or recomputed", ["source"], registry=r)

    def render(self, stats: dict[str, Any]) -> None:
        """stats: the (merged, with data parallel) get_stats."""
        h = stats.get("hicache")
        if not h:
            return
        for tier in ("queue", "l2", "l3"):
            self.hit_tokens.labels(tier).set(h["hit_tokens"][tier])
        for tier in ("l2", "l3"):
            self.bytes_written.labels(tier).set(h["writer"]["bytes_written"].get(tier, 0))
            self.faults.labels(tier).set((h[tier] or {}).get("faults", 0))
            self.auth_faults.labels(tier).set((h[tier] or {}).get("auth_faults", 0))
        self.used_bytes.labels("l2").set((h["l2"] or {}).get("used_bytes", 0))
        self.used_bytes.labels("l3").set((h["l3"] or {}).get("bytes_stored", 0))
        self.bytes_loaded.set(h["bytes_loaded"])
        self.loads.set(h["loads"])
        self.load_seconds.set(h["load_seconds"])
        self.writes_dropped.set(h["writer"]["dropped"])
        for kind in ("out", "skipped", "dropped"):
            self.swap_out_tokens.labels(kind).set(h.get("swap_out_tokens", {}).get(kind, 0))
        for source in ("kept", "swapped", "recomputed"):
            self.readmit_tokens.labels(source).set(stats.get("readmit_tokens", {}).get(source, 0))
        for i, rep in enumerate(stats.get("replicas", [])):
            for tier in ("queue", "l2", "l3"):
                self.replica_hit_tokens.labels(str(i), tier).set(((rep.get("hicache") or {}).get("hit_tokens")
                                                                 or {}).get(tier, 0))
