"""Hierarchical cache tiers carrying hybrid models' state snapshots (mem/hicache.py backup_state / fetch,
scheduler/state_cache.py load / adopt, mem/state_records.py): an evicted node's snapshot goes to the tiers with
its K/V (and at shutdown) and a load restores it into a snapshot slot; records past the deepest snapshot in
the tiers are not served. End to end: a tiny Qwen3.5 with a pool too small for its prompts, evicted to L2 and
asked again, hits from the tier and equals transformers token for token; pools and tiers whole."""

from __future__ import annotations

from tiny_checkpoints import build_tiny, hf_greedy

from radixlang_runtime.mem.allocator import PageAllocator
from radixlang_runtime.mem.hicache import HiCache, HiCacheConfig
from radixlang_runtime.mem.radix_cache import RadixCache
from radixlang_runtime.mem.state_slots import StateSlots
from radixlang_runtime.mem.table import TableManager
from radixlang_runtime.mem.tiers.disk import DiskTier
from radixlang_runtime.mem.tiers.keys import KVFingerprint
from radixlang_runtime.protocol.sampling_params import SamplingParams
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.scheduler.state_cache import StateCache

T = 8  # record tokens
ROWS = 4  # request slots before the snapshot slots


class BytesPort:
    """K/V slots and state slots hold bytes (a record: its slots' 2 bytes each joined; a state: 4 bytes)."""

    def __init__(self, n):
        self.data = [b"\0\0"] * n
        self.states: dict[int, bytes] = {}

    def read_records(self, slots):
        return [b"".join(self.data[s] for s in slots[i:i + T]) for i in range(0, len(slots), T)]

    def write_records(self, slots, payloads):
        raw = b"".join(payloads)
        for j, s in enumerate(slots):
            self.data[s] = raw[2 * j:2 * j + 2]

    def read_state(self, slot):
        return self.states[slot]

    def write_state(self, slot, payload):
        if len(payload) != 4:
            raise ValueError("not a state")
        self.states[slot] = payload


def _manager(tmp_path):
    port = BytesPort(64)
    hc = HiCache(HiCacheConfig(T), KVFingerprint("m", "float32", 4, T, 2, 1, 4), port,
                 DiskTier(str(tmp_path / "l2"), 1 << 20), None)
    hc.state_port = port
    radix = RadixCache(4)
    states = StateCache(radix, StateSlots(ROWS, 4))
    return KVManager(PageAllocator(64, 4), TableManager(ROWS), radix, hicache=hc, states=states), port


def _snapshot(kv, port, ids, pos, tag):
    """The node ending at pos holds a snapshot whose state is tag."""
    slot = kv.states.slots.alloc()
    port.states[slot] = tag
    kv.radix.match_prefix(ids[:pos]).last_node.state = slot


def test_a_snapshot_goes_to_the_tier_with_its_node_and_comes_back(tmp_path):
    kv, port = _manager(tmp_path)
    ids = list(range(1000, 1024))  # 3 records
    slots = kv.allocator.alloc_extend(-1, 0, 24)
    for s, i in zip(slots, ids):
        port.data[s] = i.to_bytes(2, "little")
    kv.radix.insert(ids, slots)
    _snapshot(kv, port, ids, 8, b"st08")
    _snapshot(kv, port, ids, 16, b"st16")  # none at 24: records past 16 are not served
    kv.ensure_free(kv.allocator.total_slots)  # evict everything: K/V and both snapshots to L2
    assert kv.cached_size() == 0 and kv.states.slots.free_count == 4
    assert kv.hicache.writer.drain(10) and kv.hicache.state_records["stored"] == 2
    req = Req("b", ids + [7], SamplingParams(max_new_tokens=1))
    kv.match(req, len(ids) + 2)
    assert req.kv_len == 16  # records 0 and 1: the deepest record end with a snapshot
    assert [port.data[s] for s in req.kv_indices] == [i.to_bytes(2, "little") for i in ids[:16]]
    assert port.states[req.state_load] == b"st16"
    assert kv.radix.match_prefix(ids[:16]).last_node.state == req.state_load
    kv.check_integrity([req])
    kv.release(req)
    kv.check_integrity([])


def test_records_without_a_snapshot_in_the_tier_are_a_miss(tmp_path):
    kv, port = _manager(tmp_path)
    ids = list(range(2000, 2016))
    slots = kv.allocator.alloc_extend(-1, 0, 16)
    kv.radix.insert(ids, slots)
    kv.ensure_free(kv.allocator.total_slots)
    assert kv.hicache.writer.drain(10) and kv.hicache.state_records["stored"] == 0
    req = Req("c", ids + [7], SamplingParams(max_new_tokens=1))
    kv.match(req, len(ids) + 2)
    assert req.kv_len == 0 and req.state_load is None and kv.cached_size() == 0
    kv.check_integrity([req])
    kv.release(req)
    kv.check_integrity([])


def test_shutdown_stores_the_snapshots_and_a_restart_loads_them(tmp_path):
    kv, port = _manager(tmp_path)
    ids = list(range(3000, 3016))
    kv.radix.insert(ids, kv.allocator.alloc_extend(-1, 0, 16))
    _snapshot(kv, port, ids, 16, b"st16")
    kv.close_tiers()  # write_back: what only L1 holds goes to the tiers, the snapshot with it
    again, port2 = _manager(tmp_path)
    req = Req("d", ids + [7], SamplingParams(max_new_tokens=1))
    again.match(req, len(ids) + 2)
    assert req.kv_len == 16 and port2.states[req.state_load] == b"st16"
    again.check_integrity([req])
    again.release(req)
    again.check_integrity([])


QWEN35 = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              bos_token_id=1, eos_token_id=2, initializer_range=0.3, max_position_embeddings=512,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
              linear_conv_kernel_dim=4, intermediate_size=96,
              layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])
NEW = 5
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}


def test_a_hybrid_engine_hits_an_evicted_prefix_from_the_tier(tmp_path):
    from radixlang_runtime import Engine

    model = build_tiny(tmp_path / "m", "Qwen3_5TextConfig", QWEN35, {})
    prompt = [(7 * i + 300) % 4000 + 10 for i in range(96)]  # 3 records of 32: its prompt-end snapshot at 96
    floods = [[(11 * i + 97 * s) % 4000 + 10 for i in range(96)] for s in range(1, 4)]
    again = prompt + [21, 22, 23, 24]
    with Engine(str(tmp_path / "m"), dtype="float32", max_total_tokens=256, page_size=16,
                enable_hierarchical_cache=True, hicache_size=0.01, hicache_storage_dir=str(tmp_path / "l2"),
                hicache_load_policy="always", debug_check_integrity=True) as eng:
        first = eng.generate(input_ids=prompt, sampling_params=SP)
        assert first["output_ids"] == hf_greedy(model, prompt, NEW)
        for f in floods:  # the pool holds 256 tokens: these evict the first prompt's K/V and snapshot
            eng.generate(input_ids=f, sampling_params=SP)
        assert eng._loop.call(lambda s: s.kv.hicache.writer.drain(30))
        out = eng.generate(input_ids=again, sampling_params=SP)
        assert out["output_ids"] == hf_greedy(model, again, NEW)
        assert out["meta_info"]["cached_tokens"] == 96
        stats = eng.get_stats()["hicache"]
        assert stats["hit_tokens"]["l2"] + stats["hit_tokens"]["queue"] > 0
        assert stats["state_records"]["loaded"] >= 1
        eng.check_integrity()
        eng._loop.call(lambda s: s.kv.hicache.check_integrity(deep=True))
