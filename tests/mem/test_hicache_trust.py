"""What the hierarchical cache trusts: records are keyed by the weights' content (a fine-tune of the same shapes
and file sizes never reads the base model's K/V, from L2 or L3), sealed by a keyed MAC (a forged record with a
valid header is a miss, counted), and the L2 directory's files are hostile (FIFOs and symlinks refused, nothing
outside the directory read, written or deleted)."""

from __future__ import annotations

import os
import threading

import pytest
from redis_utils import RedisServer
from tiny_checkpoints import build_tiny, hf_greedy

from radixlang_runtime import Engine
from radixlang_runtime.mem.tiers import weights_digest
from radixlang_runtime.mem.tiers.disk import DiskTier
from radixlang_runtime.mem.tiers.keys import chain_keys, model_identity
from radixlang_runtime.mem.tiers.record import HEADER, RecordCodec
from radixlang_runtime.mem.tiers.redis_tier import RedisTier
from radixlang_runtime.mem.tiers.secret import KEY_FILE, directory_mac_key
from radixlang_runtime.server.hicache_metrics import HiCacheMetrics

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3, max_position_embeddings=512)
NEW = 6
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
PROMPTS = [[(11 * i + 7 * s + 5) % 4000 + 10 for i in range(130)] for s in range(5)]  # 4 records of 32 each
SECRET = "a deployment secret of the test"


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    """A base model and a "fine-tune": the same config, shapes and file sizes, other weights."""
    import torch

    base_dir, tuned_dir = tmp_path_factory.mktemp("base"), tmp_path_factory.mktemp("tuned")
    base = build_tiny(base_dir, "LlamaConfig", TINY, {})
    tuned = build_tiny(tuned_dir, "LlamaConfig", TINY, {})
    with torch.no_grad():
        for p in tuned.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tuned.save_pretrained(tuned_dir, safe_serialization=True)
    sizes = [os.path.getsize(os.path.join(d, "model.safetensors")) for d in (base_dir, tuned_dir)]
    assert sizes[0] == sizes[1]  # what the old identity (names + sizes) could not tell apart
    return (str(base_dir), base), (str(tuned_dir), tuned)


def test_weights_digest_follows_the_content_and_is_cached_beside_the_file(tmp_path, monkeypatch):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.write_bytes(b"\1" * 4096)
    b.write_bytes(b"\2" * 4096)
    calls = []
    real = weights_digest.hash_file
    monkeypatch.setattr(weights_digest, "hash_file", lambda p: calls.append(p) or real(p))
    da, db = weights_digest.file_digest(str(a)), weights_digest.file_digest(str(b))
    assert da != db and len(calls) == 2 and os.path.exists(str(a) + weights_digest.SIDECAR)
    assert weights_digest.file_digest(str(a)) == da and len(calls) == 2  # from the sidecar
    st = os.stat(a)
    with open(a, "r+b") as f:  # an in-place update of the same size, its mtime put back
        f.write(b"\3")
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights_digest.file_digest(str(a)) != da and len(calls) == 3  # the ctime changed: hashed again
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "m.gguf").write_bytes(b"\4" * 100)
    os.chmod(ro, 0o500)
    try:  # a read-only model directory: the sidecar goes to the fallback directory
        first = weights_digest.file_digest(str(ro / "m.gguf"), str(tmp_path / "cache"))
        if not os.access(ro, os.W_OK):  # (root writes anyway)
            assert os.listdir(tmp_path / "cache" / "weight-digests")
        assert weights_digest.file_digest(str(ro / "m.gguf"), str(tmp_path / "cache")) == first
    finally:
        os.chmod(ro, 0o700)


def _kw(tmp_path, srv) -> dict:
    return dict(dtype="float32", max_total_tokens=1024, enable_hierarchical_cache=True, hicache_size=0.01,
                hicache_storage_dir=str(tmp_path / "l2"), hicache_load_policy="always",
                hicache_write_policy="write_through", hicache_storage_backend="redis", hicache_redis_url=srv.url,
                hicache_secret=SECRET)


def test_a_fine_tune_never_reads_the_base_models_records(two_checkpoints, tmp_path):
    """One L2 directory and one Redis: the fine-tune's greedy outputs equal transformers' on the fine-tune,
    none of its prompt tokens come from the tiers; the base model itself still hits them."""
    (base_dir, base), (tuned_dir, tuned) = two_checkpoints
    assert model_identity(base_dir) != model_identity(tuned_dir)
    srv = RedisServer(str(tmp_path))
    try:
        with Engine(base_dir, **_kw(tmp_path, srv)) as eng:
            assert [eng.generate(input_ids=p, sampling_params=SP)["output_ids"] for p in PROMPTS] \
                == [hf_greedy(base, p, NEW) for p in PROMPTS]
            assert eng._loop.call(lambda s: s.kv.hicache.writer.drain(30))
            assert eng.get_stats()["hicache"]["l2"]["records"] == 4 * len(PROMPTS)
        with Engine(tuned_dir, **_kw(tmp_path, srv)) as eng:
            got = [eng.generate(input_ids=p, sampling_params=SP) for p in PROMPTS]
            assert [o["output_ids"] for o in got] == [hf_greedy(tuned, p, NEW) for p in PROMPTS]
            assert [o["meta_info"]["cached_tokens"] for o in got] == [0] * len(PROMPTS)
            h = eng.get_stats()["hicache"]
            assert h["hit_tokens"] == {"queue": 0, "l2": 0, "l3": 0} and h["l2"]["faults"] == 0
            eng.check_integrity()
        with Engine(base_dir, **{**_kw(tmp_path, srv), "hicache_size": 0}) as eng:  # the contrast: L3 serves
            out = eng.generate(input_ids=PROMPTS[0], sampling_params=SP)
            assert out["output_ids"] == hf_greedy(base, PROMPTS[0], NEW)
            assert eng.get_stats()["hicache"]["hit_tokens"]["l3"] == 128
            eng.check_integrity()
    finally:
        srv.stop()


def test_a_forged_record_is_a_miss_and_counted(two_checkpoints, tmp_path):
    """A record rewritten with a valid header and its payload chosen (sealed under another key, as anyone who
    can write the directory or Redis could): a miss, the output unchanged, counted in auth_faults."""
    (base_dir, base), _ = two_checkpoints
    srv = RedisServer(str(tmp_path))
    forger = RecordCodec(b"\x5a" * 32)
    try:
        kw = _kw(tmp_path, srv)
        want = hf_greedy(base, PROMPTS[0], NEW)
        with Engine(base_dir, **kw) as eng:
            assert eng.generate(input_ids=PROMPTS[0], sampling_params=SP)["output_ids"] == want
            assert eng._loop.call(lambda s: s.kv.hicache.writer.drain(30))
            hc = eng._loop.call(lambda s: s.kv.hicache)
            keys = chain_keys(hc.root, PROMPTS[0], 32)
            size = HEADER.size + hc.l2.record_bytes
            payload = b"\0" * hc.l2.record_bytes
            with open(hc.l2._path(keys[2]), "wb") as f:  # record 2 forged in L2 and in L3
                f.write(forger.encode(keys[2], payload))
            assert os.path.getsize(hc.l2._path(keys[2])) == size
            hc.l3.client.set(hc.l3._name(keys[2]), forger.encode(keys[2], payload))
            assert eng.flush_cache(["l1"])
            out = eng.generate(input_ids=PROMPTS[0], sampling_params=SP)
            assert out["output_ids"] == want and out["meta_info"]["cached_tokens"] == 64  # records 0, 1 only
            h = eng.get_stats()["hicache"]
            assert h["l2"]["auth_faults"] == 1 and h["l3"]["auth_faults"] == 1
            assert h["l2"]["faults"] == 1 and h["l3"]["faults"] == 1
            eng.check_integrity()
            stats = eng.get_stats()
    finally:
        srv.stop()
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry()
    HiCacheMetrics(reg).render(stats)
    text = generate_latest(reg).decode()
    assert 'radixlang:hicache_auth_faults{tier="l2"} 1.0' in text
    assert 'radixlang:hicache_auth_faults{tier="l3"} 1.0' in text


def test_the_directory_key_is_refused_when_another_could_have_written_it(tmp_path):
    key = directory_mac_key(str(tmp_path))
    path = tmp_path / KEY_FILE
    assert os.stat(path).st_mode & 0o777 == 0o600 and directory_mac_key(str(tmp_path)) == key
    os.chmod(path, 0o644)
    with pytest.raises(RuntimeError, match="0600"):
        directory_mac_key(str(tmp_path))
    os.unlink(path)
    outside = tmp_path / "outside_key"
    outside.write_bytes(b"k" * 32)
    os.chmod(outside, 0o600)
    os.symlink(outside, path)
    with pytest.raises(RuntimeError, match="symlink"):
        directory_mac_key(str(tmp_path))


def test_redis_tier_refuses_values_sealed_under_another_key(tmp_path):
    srv = RedisServer(str(tmp_path))
    try:
        mine = RedisTier(srv.url, "ns", 4, mac_key=b"\1" * 32)
        theirs = RedisTier(srv.url, "ns", 4, mac_key=b"\2" * 32)
        assert theirs.put(b"a" * 16, b"evil")
        assert mine.get_many([b"a" * 16]) == [None] and mine.stats()["auth_faults"] == 1
        assert mine.client.get(mine._name(b"a" * 16)) is None  # deleted
    finally:
        srv.stop()


def _outside(tmp_path):
    """A directory outside the cache with files of every name the cache might touch."""
    out = tmp_path / "outside"
    out.mkdir()
    names = ["ab" + "0" * 30 + ".kv", "ab" + "0" * 30 + ".kv.1.2.tmp", "precious.txt", ".lock"]
    for n in names:
        (out / n).write_bytes(b"keep me")
    return out, names


def test_symlinks_and_fifos_in_l2_are_refused_and_nothing_outside_is_touched(tmp_path):
    out, names = _outside(tmp_path)
    d = tmp_path / "l2"
    d.mkdir()
    os.symlink(out, d / "ab")  # a symlinked subdirectory of the cache's own name
    os.symlink(out, d / "cd")
    size = HEADER.size + 100
    l2 = DiskTier(str(d), 4 * size, 100)
    assert l2.stats()["records"] == 0  # nothing indexed through the symlinks
    ab_key = bytes.fromhex("ab" + "1" * 30)
    assert not l2.put(ab_key, b"x" * 100)  # a write through the symlink: refused (a counted write fault)
    keys = [bytes([i]) * 16 for i in range(1, 6)]
    for k in keys[:3]:
        assert l2.put(k, bytes(100))
    # record 0's file becomes a symlink to a valid record outside; record 1's a FIFO
    good = out / "stolen.kv"
    good.write_bytes(open(l2._path(keys[0]), "rb").read())
    os.unlink(l2._path(keys[0]))
    os.symlink(good, l2._path(keys[0]))
    os.unlink(l2._path(keys[1]))
    os.mkfifo(l2._path(keys[1]))
    got: list = []
    reader = threading.Thread(target=lambda: got.append([l2.get(keys[0]), l2.get(keys[1])]), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "a FIFO in L2 blocked a read"
    assert got == [[None, None]] and l2.faults == 3
    assert os.path.islink(l2._path(keys[0])) and good.exists()  # the link's target is not deleted
    for k in keys[3:]:  # eviction past the capacity
        assert l2.put(k, bytes(100))
    l2.check_integrity(deep=True)
    l2.close()
    again = DiskTier(str(d), 4 * size, 100)  # a restart scans: the FIFO and the symlinks are left alone
    assert again.stats()["records"] == 3
    again.clear()
    again.check_integrity()
    again.close()
    assert sorted(os.listdir(out)) == sorted(names + ["stolen.kv"])
    assert all((out / n).read_bytes() == b"keep me" for n in names)
    assert os.path.islink(d / "ab") and os.path.islink(d / "cd")


def test_secret_flags_are_read_checked_and_never_served(tmp_path):
    from radixlang_runtime.server_args import REDACTED, ServerArgs

    f = tmp_path / "secret"
    f.write_bytes(b"0123456789abcdef-from-a-file\n")
    args = ServerArgs(enable_hierarchical_cache=True, hicache_secret_file=str(f))
    assert args.hicache_mac_secret() == b"0123456789abcdef-from-a-file"  # the trailing newline dropped
    args = ServerArgs(enable_hierarchical_cache=True, hicache_secret=SECRET)
    assert args.to_public_dict()["hicache_secret"] == REDACTED and SECRET not in repr(args)
    for kw, needle in (({"hicache_secret": SECRET, "hicache_secret_file": str(f)}, "not both"),
                       ({"hicache_secret_file": str(tmp_path / "missing")}, "cannot be read"),
                       ({"hicache_storage_backend": "redis", "hicache_redis_url": "redis://127.0.0.1:1/0",
                         "hicache_secret": "x" * 15}, "at least 16 bytes")):
        with pytest.raises(ValueError, match=needle):
            ServerArgs(enable_hierarchical_cache=True, **kw)
