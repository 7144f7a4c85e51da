"""The prefix cache's namespaces (mem/cache_namespace.py): a cache_salt moves a request's radix keys out of every
other salt's range (and the adapters'); the hicache tiers key a salted namespace's records from a root of its
own; the placement trees (DP and the PD router) key a salted prompt in its namespace too."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
from test_hicache_tiers import FP, FakePort, T

from radixlang_runtime.mem.allocator import PageAllocator
from radixlang_runtime.mem.cache_namespace import (NAMESPACE_SHIFT, TOKEN_MASK, namespace_offset, namespaced,
                                                   salt_hex, salt_key, split_namespace)
from radixlang_runtime.mem.hicache import HiCache, HiCacheConfig
from radixlang_runtime.mem.radix_cache import RadixCache
from radixlang_runtime.mem.table import TableManager
from radixlang_runtime.mem.tiers.disk import DiskTier
from radixlang_runtime.mem.tiers.keys import FORMAT_VERSION, KEY_BYTES
from radixlang_runtime.protocol.generate_input import GenerateRequest
from radixlang_runtime.protocol.limits import FieldError, RuntimeLimits
from radixlang_runtime.protocol.request_extras import RequestExtras, parse_extras, prompt_extras
from radixlang_runtime.protocol.sampling_params import SamplingParams
from radixlang_runtime.router.pd_proxy import routing_key
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.scheduler.request import Req

IDS = list(range(100, 132))
LIMITS = RuntimeLimits(context_len=4096, vocab_size=50000, num_slots=4096)


def test_keys_of_each_salt_and_adapter_are_apart_and_read_back():
    a, b = salt_key("tenant-a"), salt_key("tenant-b")
    assert salt_key(None) == 0 and a and b and a != b
    assert salt_key("tenant-a") == a  # stable: the same salt shares across requests (and restarts)
    keys = {ns: namespaced(IDS, *ns) for ns in [(0, 0), (0, a), (0, b), (3, 0), (3, a)]}
    assert keys[(0, 0)] == IDS  # the unsalted base keeps the plain ids
    assert len({k[0] for k in keys.values()}) == len(keys)  # no two namespaces share a first key
    for (lora, salt), k in keys.items():
        assert [t & TOKEN_MASK for t in k] == IDS
        assert all(split_namespace(t) == (lora, salt) for t in k)
        assert k[0] - IDS[0] == namespace_offset(lora, salt)
    assert namespace_offset(3, 0) == 3 << NAMESPACE_SHIFT


def test_the_radix_tree_serves_a_prefix_only_within_its_salt():
    tree = RadixCache(page_size=1)
    salted = Req("a", list(IDS), SamplingParams(max_new_tokens=1), cache_salt="tenant-a")
    tree.insert(salted.cache_ids, list(range(len(IDS))))
    same = Req("a2", list(IDS) + [5], SamplingParams(max_new_tokens=1), cache_salt="tenant-a")
    assert tree.match_prefix(same.cache_ids).length == len(IDS)
    for other in (Req("b", list(IDS), SamplingParams(max_new_tokens=1), cache_salt="tenant-b"),
                  Req("c", list(IDS), SamplingParams(max_new_tokens=1)),
                  Req("d", list(IDS), SamplingParams(max_new_tokens=1), lora_id=1, cache_salt="tenant-a")):
        assert tree.match_prefix(other.cache_ids).length == 0, other.rid


def _legacy_digest(fp) -> bytes:
    """The fingerprint digest as it was before salts: unsalted records keep their keys across the upgrade."""
    fields = {k: v for k, v in dataclasses.asdict(fp).items() if k != "salt"}
    text = json.dumps({**fields, "format": FORMAT_VERSION}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=KEY_BYTES).digest()


def test_a_salt_is_part_of_the_tier_fingerprint():
    assert FP.digest() == _legacy_digest(FP)
    a, b = (dataclasses.replace(FP, salt=salt_hex(salt_key(s))) for s in ("tenant-a", "tenant-b"))
    assert len({FP.digest(), a.digest(), b.digest()}) == 3
    assert "tenant-a" not in a.salt  # the digest, never the salt itself, goes to the tiers


def _computed(kv, port, req):
    """Run req's prompt (its K/V: 2 bytes per token from its id), release it; returns its cache hit."""
    kv.match(req, len(req.input_ids) + 1)
    cached = req.kv_len
    kv.assign_row(req)
    for pos, s in zip(range(req.kv_len, len(req.input_ids)), kv.alloc(req, len(req.input_ids) - req.kv_len)):
        port.data[s] = req.input_ids[pos].to_bytes(2, "little")
    kv.release(req)
    return cached


def test_the_tiers_serve_a_salted_prefix_only_to_its_salt(tmp_path):
    port = FakePort(64)
    hc = HiCache(HiCacheConfig(T), FP, port, DiskTier(str(tmp_path / "l2"), 1 << 20, 2 * T), None)
    kv = KVManager(PageAllocator(64, 4), TableManager(4), RadixCache(4), hicache=hc)
    ids = list(range(1000, 1040))  # 5 records

    def req(rid, salt):
        return Req(rid, ids + [7], SamplingParams(max_new_tokens=1), cache_salt=salt)

    assert _computed(kv, port, req("a", "tenant-a")) == 0
    kv.ensure_free(kv.allocator.total_slots)  # evict everything: write_back stores it in L2
    assert kv.cached_size() == 0 and hc.writer.drain(10)
    assert _computed(kv, port, req("b", "tenant-b")) == 0  # another salt: no record is its
    assert _computed(kv, port, req("n", None)) == 0  # nor the unsalted namespace's
    assert hc.hit_tokens["l2"] + hc.hit_tokens["queue"] == 0
    kv.ensure_free(kv.allocator.total_slots)
    assert _computed(kv, port, req("a2", "tenant-a")) == len(ids)  # its own salt: every record, from L2
    kv.check_integrity([])


@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "The same prompt"}),
    ("/v1/completions", {"prompt": [5, 6, 7]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
])
def test_placement_keys_follow_the_salt(path, body):
    plain = routing_key(path, body)
    salted = routing_key(path, {**body, "cache_salt": "tenant-a"})
    assert [t & TOKEN_MASK for t in salted] == plain and salted[0] != plain[0]
    assert routing_key(path, {**body, "cache_salt": "tenant-a"}) == salted
    assert routing_key(path, {**body, "cache_salt": "tenant-b"})[0] != salted[0]
    if path == "/generate":  # SGLang's name for it
        assert routing_key(path, {**body, "extra_key": "tenant-a"}) == salted


def test_dp_placement_key_is_the_request_namespace():
    sp = SamplingParams(max_new_tokens=1)
    plain = GenerateRequest("r", list(IDS), sp)
    salted = GenerateRequest("s", list(IDS), sp, extras=RequestExtras(cache_salt="tenant-a"))
    assert plain.prefix_key == IDS
    assert salted.prefix_key == Req("s", list(IDS), sp, cache_salt="tenant-a").cache_ids


@pytest.mark.parametrize("body,field", [
    ({"cache_salt": ""}, "cache_salt"), ({"cache_salt": 7}, "cache_salt"), ({"cache_salt": ["a"]}, "cache_salt"),
    ({"cache_salt": "x" * 1025}, "cache_salt"), ({"extra_key": ""}, "extra_key"),
    ({"cache_salt": "a", "extra_key": "b"}, "extra_key"),
])
def test_bad_salts_are_refused_by_name(body, field):
    with pytest.raises(FieldError) as e:
        prompt_extras(body, LIMITS, 1, is_list=False)
    assert e.value.param == field
    if field == "cache_salt":  # the OpenAI routes' single value is checked alike
        with pytest.raises(FieldError) as e:
            parse_extras(body, LIMITS)
        assert e.value.param == field


def test_extra_key_is_the_salt_on_the_native_body():
    assert prompt_extras({"extra_key": "k"}, LIMITS, 1, False) == [RequestExtras("k")]
    assert prompt_extras({"extra_key": "k", "cache_salt": "k"}, LIMITS, 1, False) == [RequestExtras("k")]
    with pytest.raises(FieldError):
        parse_extras({"return_hidden_states": True}, LIMITS)  # the server runs without the flag
