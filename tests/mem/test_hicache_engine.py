"""The hierarchical KV cache end to end on a tiny float32 checkpoint: greedy outputs equal transformers'
with the tiers on and a pool too small for the working set; a restart finds the prefix on disk (L2); a
second engine finds it in Redis (L3, as a DP replica would); corrupt / truncated records and a Redis
killed mid-run are misses with the same outputs."""

from __future__ import annotations

import os

import pytest
from redis_utils import RedisServer
from tiny_checkpoints import build_tiny, hf_greedy

from radixlang_runtime import Engine
from radixlang_runtime.mem.tiers.keys import chain_keys

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3, max_position_embeddings=512)
NEW = 6
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
SYSTEM = [(7 * i + 300) % 4000 + 10 for i in range(96)]  # 3 records of 32 tokens
SESSIONS = [SYSTEM + [(13 * i + 97 * s) % 4000 + 10 for i in range(48)] for s in range(6)]  # 144 tokens each
LONG = [(11 * i + 5) % 4000 + 10 for i in range(320)]  # 10 records


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_llama")
    model = build_tiny(d, "LlamaConfig", TINY, {})
    return str(d), model


def _hicache(eng) -> dict:
    return eng.get_stats()["hicache"]


def _drain(eng) -> None:
    assert eng._loop.call(lambda s: s.kv.hicache.writer.drain(30))


def test_outputs_equal_transformers_with_tiers_and_a_small_pool(tiny, tmp_path):
    model_dir, model = tiny
    want = [hf_greedy(model, p, NEW) for p in SESSIONS]
    with Engine(model_dir, dtype="float32", max_total_tokens=256, enable_hierarchical_cache=True,
                hicache_size=0.01, hicache_storage_dir=str(tmp_path / "l2"), debug_check_integrity=True,
                hicache_load_policy="always") as eng:
        for _ in range(2):  # the second round finds the sessions' own records evicted, in the tiers
            got = [eng.generate(input_ids=p, sampling_params=SP)["output_ids"] for p in SESSIONS]
            assert got == want
        stats = _hicache(eng)
        assert stats["hit_tokens"]["l2"] + stats["hit_tokens"]["queue"] >= 32
        assert stats["writer"]["written"]["l2"] >= 6 and stats["bytes_loaded"] > 0
        eng.check_integrity()
        _drain(eng)
        eng._loop.call(lambda s: s.kv.hicache.check_integrity(deep=True))


def test_restart_loads_the_prefix_from_disk_and_bad_records_are_misses(tiny, tmp_path):
    model_dir, model = tiny
    want = hf_greedy(model, LONG, NEW)
    kw = dict(dtype="float32", max_total_tokens=1024, enable_hierarchical_cache=True, hicache_size=0.01,
              hicache_storage_dir=str(tmp_path / "l2"), hicache_load_policy="always")  # not timing-dependent
    with Engine(model_dir, **kw) as first:  # write_back: shutdown stores what only L1 held
        assert first.generate(input_ids=LONG, sampling_params=SP)["output_ids"] == want
    with Engine(model_dir, **kw) as eng:
        before = eng.get_stats()["prefill_tokens_computed"]
        out = eng.generate(input_ids=LONG, sampling_params=SP)
        assert out["output_ids"] == want
        assert out["meta_info"]["cached_tokens"] == 288  # 9 records of 32: the last token stays to compute
        assert eng.get_stats()["prefill_tokens_computed"] - before == len(LONG) - 288
        l2 = eng._loop.call(lambda s: s.kv.hicache.l2)
        keys = chain_keys(eng._loop.call(lambda s: s.kv.hicache.root), LONG, 32)
        for bad, cached in ((lambda p: os.truncate(p, os.path.getsize(p) - 100), 192),  # record 6 truncated
                            (lambda p: _flip_last_byte(p), 96)):  # record 3 corrupt
            assert eng.flush_cache(["l1"])
            bad(l2._path(keys[cached // 32]))
            out = eng.generate(input_ids=LONG, sampling_params=SP)
            assert out["output_ids"] == want
            assert out["meta_info"]["cached_tokens"] == cached
        assert _hicache(eng)["l2"]["faults"] == 2
        eng.check_integrity()
        eng._loop.call(lambda s: s.kv.hicache.check_integrity(deep=True))
        assert eng.flush_cache(["l2"]) and _hicache(eng)["l2"]["records"] == 0


def _flip_last_byte(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(-1, 2)
        b = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([b[0] ^ 0xFF]))


def test_redis_is_shared_by_two_engines_and_a_dead_redis_is_a_miss(tiny, tmp_path):
    model_dir, model = tiny
    want = hf_greedy(model, LONG, NEW)
    srv = RedisServer(str(tmp_path))
    kw = dict(dtype="float32", max_total_tokens=1024, enable_hierarchical_cache=True, hicache_size=0,
              hicache_storage_backend="redis", hicache_redis_url=srv.url, hicache_load_policy="always",
              hicache_secret="a deployment secret of the test")
    try:
        with Engine(model_dir, hicache_write_policy="write_through", **kw) as a, Engine(model_dir, **kw) as b:
            assert a.generate(input_ids=LONG, sampling_params=SP)["output_ids"] == want
            _drain(a)
            out = b.generate(input_ids=LONG, sampling_params=SP)  # replica b: an L3 hit
            assert out["output_ids"] == want and out["meta_info"]["cached_tokens"] == 288
            assert _hicache(b)["hit_tokens"]["l3"] == 288
            srv.stop()  # Redis dies mid-run
            assert b.flush_cache(["l1"])
            out = b.generate(input_ids=LONG, sampling_params=SP)
            assert out["output_ids"] == want and out["meta_info"]["cached_tokens"] == 0
            assert _hicache(b)["l3"]["faults"] >= 1
            b.check_integrity()
            assert not b.flush_cache(["l3"])  # Redis unreachable: said, not raised
    finally:
        srv.stop()


def test_unsupported_hicache_settings_are_refused_by_name(tiny):
    model_dir, _ = tiny
    for kw, needle in (({"hicache_size": 1.0}, "without enable_hierarchical_cache"),
                       ({"enable_hierarchical_cache": True, "hicache_storage_backend": "mooncake"}, "mooncake"),
                       ({"enable_hierarchical_cache": True, "hicache_write_policy": "write_through_selective"},
                        "hicache_write_policy"),
                       ({"enable_hierarchical_cache": True, "hicache_storage_backend": "redis"}, "hicache_redis_url"),
                       ({"enable_hierarchical_cache": True, "hicache_storage_backend": "redis",
                         "hicache_redis_url": "redis://127.0.0.1:1/0"}, "needs hicache_secret or hicache_secret_file"),
                       ({"enable_hierarchical_cache": True, "hicache_secret": "short"}, "at least 16 bytes"),
                       ({"hicache_secret": "a deployment secret of the test"}, "without enable_hierarchical_cache"),
                       ({"enable_hierarchical_cache": True, "disable_radix_cache": True}, "disable_radix_cache"),
                       ({"enable_hierarchical_cache": True, "hicache_storage_backend": "file",
                         "hicache_storage_backend_extra_config": '{"ttl_s": 60}'}, "ttl_s needs hicache_storage_"),
                       ({"enable_hierarchical_cache": True, "hicache_storage_backend_extra_config": '{"ttl": 60}'},
                        "unknown key.*'ttl'"),
                       ({"enable_hierarchical_cache": True, "hicache_storage_backend_extra_config": "[1]"},
                        "hicache_storage_backend_extra_config must be a JSON object"),
                       ({"hicache_storage_backend_extra_config": '{"ttl_s": 60}'}, "without enable_hierarchical")):
        with pytest.raises(ValueError, match=needle):
            Engine(model_dir, dtype="float32", **kw)


@pytest.mark.slow  # two server starts
def test_server_restart_finds_the_prefix_on_disk_and_shows_the_tiers(tiny, tmp_path):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families
    from server_utils import ServerProcess

    model_dir, model = tiny
    want = hf_greedy(model, LONG, NEW)
    flags = ("--model-path", model_dir, "--dtype", "float32", "--max-total-tokens", "1024", "--enable-metrics",
             "--enable-hierarchical-cache", "--hicache-size", "0.01", "--hicache-storage-dir", str(tmp_path / "l2"),
             "--hicache-load-policy", "always")

    def gen(srv) -> dict:
        r = httpx.post(srv.url + "/generate", json={"input_ids": LONG, "sampling_params": SP}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    first = ServerProcess(*flags)
    try:
        assert gen(first)["output_ids"] == want
    finally:
        assert first.stop() == 0  # SIGTERM: write_back stores what only the pool held
    srv = ServerProcess(*flags)
    try:
        out = gen(srv)  # a restarted server: the prefix comes from L2
        assert out["output_ids"] == want and out["meta_info"]["cached_tokens"] == 288
        metrics = {(s.name, tuple(s.labels.items())): s.value
                   for fam in text_string_to_metric_families(httpx.get(srv.url + "/metrics", timeout=30).text)
                   for s in fam.samples}
        assert metrics[("radixlang:hicache_hit_tokens", (("tier", "l2"),))] == 288
        assert metrics[("radixlang:hicache_bytes_loaded", ())] > 0
        assert metrics[("radixlang:hicache_used_bytes", (("tier", "l2"),))] > 0
        bad = httpx.post(srv.url + "/flush_cache?tiers=l9", timeout=30)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tiers"
        assert httpx.post(srv.url + "/flush_cache?tiers=l2", timeout=60).status_code == 200
        info = httpx.get(srv.url + "/server_info", timeout=30).json()
        assert info["stats"]["hicache"]["l2"]["records"] == 0 and info["stats"]["hicache"]["loads"] == 1
        assert gen(srv)["meta_info"]["cached_tokens"] == 304  # L1 kept it (only L2 was flushed)
    finally:
        srv.stop()


def test_retraction_swaps_to_l2_with_outputs_equal_transformers(tiny, tmp_path):
    """A pool too small for the decodes: retract_decode swaps victims' records out to L2, readmission loads
    the ones eviction took; greedy outputs equal transformers' token for token."""
    model_dir, model = tiny
    prompts = [[(29 * i + 53 * r) % 4000 + 10 for i in range(40)] for r in range(8)]
    sp = {"max_new_tokens": 40, "min_new_tokens": 40, "temperature": 0}
    want = [hf_greedy(model, p, 40) for p in prompts]
    with Engine(model_dir, dtype="float32", max_total_tokens=256, new_token_ratio_init=0.05,
                new_token_ratio_min=0.05, enable_hierarchical_cache=True, hicache_size=0.01,
                hicache_storage_dir=str(tmp_path / "l2"), hicache_load_policy="always",
                debug_check_integrity=True) as eng:
        got = [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params=[sp] * len(prompts))]
        assert got == want
        stats = eng.get_stats()
        assert stats["num_retractions"] > 0
        assert stats["readmit_tokens"]["swapped"] > 0 and stats["hicache"]["swap_out_tokens"]["out"] > 0
        assert stats["hicache"]["preemption_mode"] == "swap"  # --preemption-mode's default with the tiers
        eng.check_integrity()
        _drain(eng)
        eng._loop.call(lambda s: s.kv.hicache.check_integrity(deep=True))


@pytest.mark.slow  # one DP=2 server
def test_dp2_l3_hit_on_the_other_replica_with_ttl_and_stats_over_both(tiny, tmp_path):
    """--dp-size 2 (round robin) over one Redis with a ttl: a prefix computed on replica 0 is an L3 hit on
    replica 1; stats.hicache and /metrics sum both replicas (each one's own stays under replicas)."""
    import httpx
    import redis
    from prometheus_client.parser import text_string_to_metric_families
    from server_utils import ServerProcess

    model_dir, model = tiny
    want = hf_greedy(model, LONG, NEW)
    rs = RedisServer(str(tmp_path))
    srv = None
    try:
        srv = ServerProcess("--model-path", model_dir, "--dtype", "float32", "--max-total-tokens", "1024",
                            "--dp-size", "2", "--load-balance-method", "round_robin", "--enable-metrics",
                            "--enable-hierarchical-cache", "--hicache-size", "0", "--hicache-storage-backend", "redis",
                            "--hicache-redis-url", rs.url, "--hicache-write-policy", "write_through",
                            "--hicache-load-policy", "always", "--hicache-storage-backend-extra-config",
                            '{"ttl_s": 600}', "--hicache-secret", "a deployment secret of the test")
        outs = []
        for _ in range(2):  # replica 0 computes and writes through; replica 1 finds it in L3
            r = httpx.post(srv.url + "/generate", json={"input_ids": LONG, "sampling_params": SP}, timeout=120)
            assert r.status_code == 200, r.text
            outs.append(r.json())
            if len(outs) == 1:  # the writer thread stores in the background: wait (bounded) for its 10 records
                _wait_for(lambda: len(_l3_names(rs)) >= 10)
        assert [o["output_ids"] for o in outs] == [want, want]
        assert outs[1]["meta_info"]["cached_tokens"] == 288
        stats = httpx.get(srv.url + "/server_info", timeout=30).json()["stats"]
        per = [rep["hicache"] for rep in stats["replicas"]]
        assert [h["hit_tokens"]["l3"] for h in per] == [0, 288]
        h = stats["hicache"]
        assert h["replicas"] == 2 and h["hit_tokens"]["l3"] == 288 and h["lookups"] == sum(p["lookups"] for p in per)
        assert h["l3"]["bytes_stored"] == sum(p["l3"]["bytes_stored"] for p in per) > 0
        assert h["l3"]["ttl_s"] == 600
        client = redis.Redis.from_url(rs.url)
        ttls = [client.pttl(n) for n in _l3_names(rs)]
        assert ttls and all(0 < t <= 600_000 for t in ttls)  # every record expires
        metrics = {(s.name, tuple(s.labels.items())): s.value
                   for fam in text_string_to_metric_families(httpx.get(srv.url + "/metrics", timeout=30).text)
                   for s in fam.samples}
        assert metrics[("radixlang:hicache_hit_tokens", (("tier", "l3"),))] == 288
        assert metrics[("radixlang:hicache_replica_hit_tokens", (("replica", "1"), ("tier", "l3")))] == 288
        assert metrics[("radixlang:hicache_replica_hit_tokens", (("replica", "0"), ("tier", "l3")))] == 0
    finally:
        if srv is not None:
            srv.stop()
        rs.stop()


def _l3_names(rs) -> list:
    import redis

    return list(redis.Redis.from_url(rs.url).scan_iter(match="radixlang:kv:*"))


def _wait_for(cond, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
