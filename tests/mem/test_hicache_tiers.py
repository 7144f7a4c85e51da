"""The hierarchical KV cache's storage (torch-free parts): keys, records, the disk tier (L2), Redis (L3),
the background writer, and the controller under a KVManager with a fake pool (mem/hicache.py)."""

from __future__ import annotations

import os

import pytest
from redis_utils import RedisServer

from radixlang_runtime.mem.allocator import PageAllocator
from radixlang_runtime.mem.hicache import HiCache, HiCacheConfig, check_flush_tiers
from radixlang_runtime.mem.radix_cache import RadixCache
from radixlang_runtime.mem.table import TableManager
from radixlang_runtime.mem.tiers import record
from radixlang_runtime.mem.tiers.disk import DiskTier
from radixlang_runtime.mem.tiers.keys import KVFingerprint, chain_keys
from radixlang_runtime.mem.tiers.record import RecordAuthError, RecordCodec, RecordError
from radixlang_runtime.mem.tiers.redis_tier import RedisTier
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.protocol.sampling_params import SamplingParams

T = 8  # record tokens in these tests
KEY = b"\x11" * 32  # a MAC key (secret.mac_key_from_secret's size)
CODEC = RecordCodec(KEY)
FP = KVFingerprint("m", "float32", 4, T, 2, 1, 4)


def test_keys_chain_the_prefix_and_the_fingerprint():
    ids = list(range(100, 124))
    keys = chain_keys(FP.digest(), ids, T)
    assert len(keys) == 3 and len(set(keys)) == 3
    assert chain_keys(FP.digest(), ids[:16], T) == keys[:2]  # a prefix has the prefix's keys
    other = list(ids)
    other[0] += 1  # the same third record after a different first one: another key
    assert chain_keys(FP.digest(), other, T)[2] != keys[2]
    for change in ({"dtype": "bfloat16"}, {"tp_rank": 1}, {"model": "n"}, {"page_size": 8}):
        fp = KVFingerprint(**{**FP.__dict__, **change})
        assert chain_keys(fp.digest(), ids, T)[0] != keys[0], change


def test_record_round_trip_and_each_fault():
    key, other = b"k" * 16, b"o" * 16
    blob = CODEC.encode(key, b"payload!")
    assert CODEC.decode(key, blob, 8) == b"payload!"
    bad = [blob[:10], blob[:-1], blob[:-1] + bytes([blob[-1] ^ 1]), b"XXXX" + blob[4:]]
    for b in bad:
        with pytest.raises(RecordError):
            CODEC.decode(key, b)
    with pytest.raises(RecordAuthError):  # a flipped payload byte: the MAC is the check
        CODEC.decode(key, blob[:-1] + bytes([blob[-1] ^ 1]))
    with pytest.raises(RecordAuthError):  # the same record under another key: refused
        RecordCodec(b"\x22" * 32).decode(key, blob)
    with pytest.raises(RecordError, match="stale"):
        CODEC.decode(other, blob)
    with pytest.raises(RecordError, match="hold 9"):
        CODEC.decode(key, blob, 9)


def test_disk_tier_lru_bound_faults_and_rescan(tmp_path):
    size = record.HEADER.size + 100
    l2 = DiskTier(str(tmp_path), 3 * size, 100)
    keys = [bytes([i]) * 16 for i in range(5)]
    for i, k in enumerate(keys[:3]):
        assert l2.put(k, bytes([i]) * 100)
    assert l2.get(keys[0]) == bytes([0]) * 100  # now most recent
    assert l2.put(keys[3], b"\3" * 100)  # evicts keys[1], the least recent
    assert [l2.contains(k) for k in keys[:4]] == [True, False, True, True]
    assert l2.used_bytes == 3 * size
    assert not l2.put(keys[4], b"x" * (3 * size))  # bigger than the whole tier
    l2.check_integrity(deep=True)

    path = l2._path(keys[2])  # corrupt one byte of a payload
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0xFF
    open(path, "wb").write(bytes(data))
    assert l2.get(keys[2]) is None and not os.path.exists(path) and l2.faults == 1
    with open(l2._path(keys[3]), "r+b") as f:  # truncate another
        f.truncate(size - 10)
    assert l2.get(keys[3]) is None and l2.faults == 2
    l2.check_integrity(deep=True)

    other = DiskTier(str(tmp_path), 3 * size, 100)  # a second holder (a DP replica) gets a directory of its own
    assert other.dir == str(tmp_path / "replica-1") and other.stats()["records"] == 0
    other.close()
    l2.close()
    again = DiskTier(str(tmp_path), 3 * size, 100)  # a restart finds what is left
    assert again.dir == str(tmp_path)
    assert again.get(keys[0]) == bytes([0]) * 100 and again.used_bytes == size
    again.check_integrity()
    again.clear()
    assert again.stats()["records"] == 0
    again.check_integrity()


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs (a disk that fills up); skipped where mounting is not allowed."""
    import subprocess

    d = tmp_path / "small"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d)], capture_output=True,
                      timeout=10).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield str(d)
    if subprocess.run(["umount", str(d)], capture_output=True, timeout=10).returncode:
        subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=10)  # still busy: detach


def test_full_disk_is_a_failed_write_not_an_error(tiny_tmpfs):
    l2 = DiskTier(tiny_tmpfs, 1 << 20, 20_000)  # the bound is larger than the disk
    stored = [l2.put(bytes([i]) * 16, bytes([i]) * 20_000) for i in range(6)]
    assert stored[0] and not all(stored) and l2.faults == stored.count(False)
    l2.check_integrity(deep=True)  # no torn or temp file left behind
    assert [n for _, _, files in os.walk(tiny_tmpfs) for n in files if n.endswith(".tmp")] == []
    for i, ok in enumerate(stored):
        assert (l2.get(bytes([i]) * 16) is not None) == ok
    l2.close()  # its lock file would keep the tmpfs busy


def test_redis_tier_round_trip_fault_and_down(tmp_path):
    srv = RedisServer(str(tmp_path))
    try:
        l3 = RedisTier(srv.url, "ns", 4, timeout_s=0.5, retry_after_s=0.2, mac_key=KEY)
        assert l3.put(b"a" * 16, b"abcd") and l3.put(b"b" * 16, b"efgh")
        assert l3.get_many([b"a" * 16, b"c" * 16, b"b" * 16]) == [b"abcd", None, b"efgh"]
        l3.client.set(l3._name(b"b" * 16), b"garbage")  # a corrupt value: a miss, deleted
        assert l3.get_many([b"b" * 16]) == [None] and l3.client.get(l3._name(b"b" * 16)) is None
        other = RedisTier(srv.url, "other", 4, mac_key=KEY)
        assert other.put(b"z" * 16, b"zzzz")
        l3.check_integrity(deep=True)
        assert l3.clear()
        assert l3.get_many([b"a" * 16]) == [None] and other.get_many([b"z" * 16]) == [b"zzzz"]  # only its own
    finally:
        srv.stop()
    assert l3.get_many([b"a" * 16]) == [None]  # down: a miss
    assert not l3.available() and l3.faults >= 1
    assert not l3.put(b"a" * 16, b"abcd")  # skipped while down, no wait
    with pytest.raises(AssertionError, match="unreachable"):
        l3.check_integrity()


def test_redis_tier_ttl_expires_records_and_reads_refresh_it(tmp_path):
    import time

    srv = RedisServer(str(tmp_path))
    try:
        l3 = RedisTier(srv.url, "ns", 4, ttl_s=60, mac_key=KEY)
        assert l3.put(b"a" * 16, b"abcd") and 0 < l3.client.pttl(l3._name(b"a" * 16)) <= 60_000
        l3.client.pexpire(l3._name(b"a" * 16), 5)  # about to expire: a read hit gives it ttl_s again
        assert l3.get_many([b"a" * 16]) == [b"abcd"] and l3.client.pttl(l3._name(b"a" * 16)) > 1000
        short = RedisTier(srv.url, "short", 4, ttl_s=0.05, mac_key=KEY)
        assert short.put(b"b" * 16, b"efgh")
        time.sleep(0.3)  # (Redis drops an expired key on access: not a timing assertion)
        assert short.get_many([b"b" * 16]) == [None] and short.faults == 0  # expired: a plain miss
        untimed = RedisTier(srv.url, "forever", 4, mac_key=KEY)
        assert untimed.put(b"c" * 16, b"ijkl") and untimed.client.pttl(untimed._name(b"c" * 16)) == -1
        assert l3.stats()["ttl_s"] == 60 and untimed.stats()["ttl_s"] is None
    finally:
        srv.stop()


def test_redis_tier_bytes_stored_counts_each_live_record_once(tmp_path):
    """bytes_stored follows this process's own clock (a fake one here: no sleeping, no Redis expiry needed)."""
    now = [0.0]
    size = record.HEADER.size + 4
    a, b = b"a" * 16, b"b" * 16
    srv = RedisServer(str(tmp_path))
    try:
        l3 = RedisTier(srv.url, "ns", 4, ttl_s=60, clock=lambda: now[0], mac_key=KEY)
        assert l3.put(a, b"abcd") and l3.put(a, b"abcd") and l3.put(b, b"efgh")
        assert l3.stats()["bytes_stored"] == 2 * size  # a rewrite counts once
        now[0] = 50.0
        assert l3.get_many([a]) == [b"abcd"]  # a read hit: a lives until 110, b still until 60
        now[0] = 61.0
        assert l3.stats()["bytes_stored"] == size  # b expired
        now[0] = 111.0
        assert l3.bytes_stored == 0
        assert l3.put(a, b"abcd") and l3.bytes_stored == size
        assert l3.clear() and l3.bytes_stored == 0
        untimed = RedisTier(srv.url, "forever", 4, clock=lambda: now[0], mac_key=KEY)
        assert untimed.put(a, b"abcd")
        now[0] = 1e9
        assert untimed.bytes_stored == size  # no ttl: live until flushed, found bad, or evicted by Redis
        untimed.client.set(untimed._name(a), b"not a record")
        assert untimed.get_many([a]) == [None] and untimed.bytes_stored == 0  # found bad: deleted, not counted
    finally:
        srv.stop()


class FakePort:
    """Slots hold bytes; a record's payload = its slots' bytes joined (record_bytes = T * 2)."""

    def __init__(self, n):
        self.data = [b"\0\0"] * n

    def read_records(self, slots):
        return [b"".join(self.data[s] for s in slots[i:i + T]) for i in range(0, len(slots), T)]

    def write_records(self, slots, payloads):
        raw = b"".join(payloads)
        for j, s in enumerate(slots):
            self.data[s] = raw[2 * j:2 * j + 2]


def _manager(tmp_path, policy="write_back", slots=64, l3=None):
    port = FakePort(slots)
    hc = HiCache(HiCacheConfig(T, policy), FP, port, DiskTier(str(tmp_path / "l2"), 1 << 20, 2 * T), l3)
    return KVManager(PageAllocator(slots, 4), TableManager(4), RadixCache(4), hicache=hc), port


def _run(kv, port, ids, rid):
    """A request that computes all of ids (its KV: 2 bytes per token derived from its position's id)."""
    req = Req(rid, list(ids), SamplingParams(max_new_tokens=1))
    kv.match(req, len(ids) + 1)
    cached = req.kv_len
    kv.assign_row(req)
    for pos, s in zip(range(req.kv_len, len(ids)), kv.alloc(req, len(ids) - req.kv_len)):
        port.data[s] = ids[pos].to_bytes(2, "little")
    kv.release(req)
    return cached


def test_evicted_records_come_back_from_l2_with_their_kv(tmp_path):
    kv, port = _manager(tmp_path)
    a = list(range(1000, 1040))  # 5 records
    assert _run(kv, port, a, "a") == 0
    kv.ensure_free(kv.allocator.total_slots)  # evict everything: write_back backs it up
    assert kv.cached_size() == 0
    assert kv.hicache.writer.drain(10)
    req = Req("b", a + [7], SamplingParams(max_new_tokens=1))
    kv.match(req, len(a) + 2)
    assert req.kv_len == 40  # every record, from L2
    assert [port.data[s] for s in req.kv_indices] == [i.to_bytes(2, "little") for i in a]
    assert kv.hicache.hit_tokens["l2"] + kv.hicache.hit_tokens["queue"] == 40
    kv.check_integrity([req])
    kv.release(req)
    kv.check_integrity([])


def test_only_the_records_the_pool_can_take_are_fetched(tmp_path):
    kv, port = _manager(tmp_path)
    a = list(range(1000, 1040))  # 5 records
    _run(kv, port, a, "a")
    kv.ensure_free(kv.allocator.total_slots)
    assert kv.hicache.writer.drain(10)
    holder = Req("h", list(range(5000, 5048)), SamplingParams(max_new_tokens=1))  # holds 48 of the 64 slots
    kv.assign_row(holder)
    kv.alloc(holder, 48)
    assert kv.allocator.available_size() + kv.radix.evictable_size() == 2 * T
    req = Req("b", a + [7], SamplingParams(max_new_tokens=1))
    kv.match(req, len(a) + 2)
    assert req.kv_len == 2 * T  # room for two records: the first two, read and nothing more
    assert [port.data[s] for s in req.kv_indices] == [i.to_bytes(2, "little") for i in a[:2 * T]]
    assert kv.hicache.hit_tokens["l2"] + kv.hicache.hit_tokens["queue"] == 2 * T
    assert kv.hicache.bytes_loaded == 2 * 2 * T
    kv.check_integrity([req, holder])
    kv.release(req)
    kv.release(holder)
    kv.check_integrity([])


def test_a_corrupt_record_ends_the_load_there(tmp_path):
    kv, port = _manager(tmp_path)
    a = list(range(1000, 1040))
    _run(kv, port, a, "a")
    kv.ensure_free(kv.allocator.total_slots)
    assert kv.hicache.writer.drain(10)
    k2 = chain_keys(FP.digest(), a, T)[2]
    with open(kv.hicache.l2._path(k2), "r+b") as f:
        f.seek(-1, 2)
        f.write(b"\xff")
    req = Req("b", a + [7], SamplingParams(max_new_tokens=1))
    kv.match(req, len(a) + 2)
    assert req.kv_len == 16 and kv.hicache.l2.faults == 1
    kv.release(req)
    kv.check_integrity([])
    kv.hicache.check_integrity(deep=True)


def test_write_through_stores_on_insert_and_flush_clears_named_tiers(tmp_path):
    kv, port = _manager(tmp_path, "write_through")
    a = list(range(1000, 1040))
    _run(kv, port, a, "a")
    assert kv.hicache.writer.drain(10)
    assert kv.hicache.l2.stats()["records"] == 5  # without any eviction
    assert kv.flush(["l1"]) and kv.cached_size() == 0 and kv.hicache.l2.stats()["records"] == 5
    assert kv.flush(["l2"]) and kv.hicache.l2.stats()["records"] == 0
    kv.check_integrity([])


def test_check_flush_tiers():
    assert check_flush_tiers(None) is None and check_flush_tiers(["l2", "l2"]) == ["l2"]
    for bad in (["l4"], [], "l1", [1]):
        with pytest.raises(ValueError, match="tier"):
            check_flush_tiers(bad)


def test_a_recent_miss_is_not_asked_again_until_the_record_is_stored(tmp_path):
    kv, port = _manager(tmp_path)
    a = list(range(1000, 1040))
    req = Req("w", a + [7], SamplingParams(max_new_tokens=1))
    kv.match(req, len(a) + 2)  # nothing anywhere: one lookup
    kv.unmatch(req)
    kv.match(req, len(a) + 2)  # a waiting request tried again: no second lookup
    kv.unmatch(req)
    assert kv.hicache.lookups == 1
    _run(kv, port, a, "a")
    kv.ensure_free(kv.allocator.total_slots)  # backed up: the miss is forgotten
    kv.match(req, len(a) + 2)
    assert req.kv_len == 40 and kv.hicache.lookups == 2
    kv.release(req)
    kv.check_integrity([])


def test_a_tier_slower_than_recomputing_is_skipped_but_probed():
    from radixlang_runtime.mem.tier_costs import PROBE_EVERY, TierCosts

    c = TierCosts()
    assert c.worth("l2")  # nothing measured yet: try it
    c.note_prefill(100, 0.1)  # 1 ms a token
    c.note_load("l2", 32, 0.0032)  # 0.1 ms a token: worth it
    c.note_load("l3", 32, 0.32)  # 10 ms a token: slower than recomputing
    assert c.worth("l2")
    asks = [c.worth("l3") for _ in range(2 * PROBE_EVERY)]
    assert asks.count(True) == 2 and c.skipped["l3"] == 2 * PROBE_EVERY - 2  # only the probes load


def test_load_policy_faster_skips_l2_when_recompute_is_cheaper(tmp_path):
    kv, port = _manager(tmp_path)
    a = list(range(1000, 1040))
    _run(kv, port, a, "a")
    kv.ensure_free(kv.allocator.total_slots)
    assert kv.hicache.writer.drain(10)
    kv.hicache.costs.note_prefill(1000, 1e-9)  # recomputing looks free
    kv.hicache.costs.note_load("l2", 32, 1.0)
    req = Req("b", a + [7], SamplingParams(max_new_tokens=1))
    kv.match(req, len(a) + 2)
    assert req.kv_len == 0 and kv.hicache.costs.skipped["l2"] == 1
    kv.hicache.cfg.load_policy = "always"
    kv.hicache._recent_misses.clear()
    kv.match(req, len(a) + 2)
    assert req.kv_len == 40
    kv.release(req)
    kv.check_integrity([])


def test_replicas_stats_merge_sums_counters_and_keeps_settings():
    from radixlang_runtime.server.hicache_metrics import merge_hicache_stats

    def one(hits, used, cost, up):
        return {"record_tokens": 32, "write_policy": "write_back", "hit_tokens": {"queue": 0, "l2": hits, "l3": 1},
                "loads": 1, "costs": {"prefill_s_per_token": cost, "load_s_per_token": {"l2": cost, "l3": None},
                                      "skipped": {"l2": 1, "l3": 0}},
                "l2": {"used_bytes": used, "capacity_bytes": 100}, "l3": {"available": up, "ttl_s": 60}}

    m = merge_hicache_stats([one(5, 10, 1.0, True), one(7, 20, 3.0, False)])
    assert m["replicas"] == 2 and m["record_tokens"] == 32 and m["write_policy"] == "write_back"
    assert m["hit_tokens"] == {"queue": 0, "l2": 12, "l3": 2} and m["loads"] == 2
    assert m["l2"] == {"used_bytes": 30, "capacity_bytes": 200}
    assert m["l3"] == {"available": False, "ttl_s": 60}
    assert m["costs"]["prefill_s_per_token"] == 2.0 and m["costs"]["load_s_per_token"] == {"l2": 2.0, "l3": None}
    assert m["costs"]["skipped"] == {"l2": 2, "l3": 0}
    assert merge_hicache_stats([None, None]) is None
