"""mem/kv_records.py: the joined form (PD's chunks) is byte for byte the per-record form (the tiers'), both ways,
and a refused write leaves the pool as it was; a pool of per-layer entry shapes (Gemma 4's: groups) moves every
layer's K/V bit for bit, its records as long as its layers' own entries."""

from __future__ import annotations

import pytest
import torch

from radixlang_runtime.mem.kv_pool import KVPool
from radixlang_runtime.mem.kv_records import KVRecordPort


MIXED = [(2, 8), (1, 16), (2, 8), (1, 16), (4, 4)]  # (kv_heads, head_dim) per layer: three groups, interleaved


def pool(dtype: torch.dtype = torch.bfloat16, shapes=None) -> KVPool:
    p = KVPool(48, len(shapes) if shapes else 3, 2, 8, dtype, torch.device("cpu"), 1, 48, shapes=shapes)
    for g in p.groups:
        g.block.copy_(torch.randn(g.block.shape).to(dtype))
    return p


def kv(p: KVPool, slots=None) -> list[torch.Tensor]:
    """Every layer's K and V (at slots)."""
    bufs = p.k_buffers + p.v_buffers
    return [b.clone() if slots is None else b[:, slots] for b in bufs]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_mixed_pool_layout_and_record_bytes():
    p = pool(torch.float32, MIXED)
    assert [g.layers for g in p.groups] == [(0, 2), (1, 3), (4,)]
    assert [tuple(p.k_buffers[i].shape) for i in range(5)] == [(h, 48, d) for h, d in MIXED]
    per_token = 2 * sum(h * d for h, d in MIXED) * 4  # each layer's own entry, K and V, float32
    assert KVPool.bytes_per_token(5, 2, 8, torch.float32, shapes=MIXED) == per_token == p.nbytes // 48
    assert KVRecordPort(p, 4).record_bytes == 4 * per_token
    with pytest.raises(ValueError, match="3 entry shapes"):
        p.block
    p.k_buffers[1][0, 5] = 7.0  # each layer a view of its group's block
    assert p.groups[1].block[0, 0, 0, 5].eq(7.0).all()


@pytest.mark.parametrize("shapes", [None, MIXED], ids=["one_shape", "mixed"])
@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_joined_equals_records_both_ways(t, dtype, shapes):
    src = pool(dtype, shapes)
    port = KVRecordPort(src, t)
    slots = [5, 9, 1, 40, 41, 2, 33, 7][:(8 // t) * t]
    recs = port.read_records(slots)
    assert len(recs) == len(slots) // t and all(len(r) == port.record_bytes for r in recs)
    joined = port.read_joined(slots)
    assert joined == b"".join(recs)

    a, b = pool(dtype, shapes), pool(dtype, shapes)
    for ga, gb in zip(a.groups, b.groups):
        gb.block.copy_(ga.block)
    dst = [10, 11, 12, 13, 20, 21, 22, 23][:len(slots)]
    KVRecordPort(a, t).write_records(dst, recs)
    KVRecordPort(b, t).write_joined(dst, joined)
    assert same(kv(a), kv(b))
    assert same(kv(a, dst), kv(src, slots))
    one = KVRecordPort(b, t)  # a single record: unpack_records views the bytes (read-only) and copies from them
    one.write_joined(dst[:t], recs[-1])
    assert same(kv(b, dst[:t]), kv(src, slots[-t:]))


@pytest.mark.parametrize("shapes", [None, MIXED], ids=["one_shape", "mixed"])
def test_refused_writes_leave_the_pool_whole(shapes):
    p = pool(shapes=shapes)
    port = KVRecordPort(p, 2)
    recs = port.read_records([0, 1, 2, 3])
    before = kv(p)
    with pytest.raises(ValueError, match="write_joined"):
        port.write_joined([10, 11, 12, 13], b"".join(recs)[:-2])  # not whole records
    with pytest.raises(ValueError, match="write_joined"):
        port.write_joined([10, 11, 12], b"".join(recs))  # slots are not n * t
    with pytest.raises(ValueError, match="payloads of"):
        port.write_records([10, 11, 12, 13], [recs[0], recs[1][:-1]])
    assert same(kv(p), before)


def test_slot_runs():
    from radixlang_runtime.mem.kv_records import slot_runs

    assert slot_runs([]) == []
    assert slot_runs([4, 5, 6, 9, 3, 4, 0]) == [(0, 4, 3), (3, 9, 1), (4, 3, 2), (6, 0, 1)]


@pytest.mark.parametrize("shapes", [None, MIXED], ids=["one_shape", "mixed"])
@pytest.mark.parametrize("layout", ["pages", "scattered"])
def test_one_token_writes_by_runs_and_by_index_copy(layout, shapes):
    """PD's one-token records: slots in page runs take the per-run copy, scattered ones index_copy_; both put
    each record's K/V at its slot."""
    src = pool(shapes=shapes)
    slots = list(range(16))
    joined = KVRecordPort(src, 1).read_joined(slots)
    dst = [30, 31, 32, 33, 34, 35, 36, 37, 8, 9, 10, 11, 12, 13, 14, 15] if layout == "pages" else \
        [30, 2, 17, 5, 44, 21, 8, 39, 12, 26, 0, 47, 33, 19, 6, 41]
    p = pool(shapes=shapes)
    want = kv(p)
    for w, s in zip(want, kv(src)):
        w[:, dst] = s[:, slots]
    KVRecordPort(p, 1).write_joined(dst, joined)
    assert same(kv(p), want)
