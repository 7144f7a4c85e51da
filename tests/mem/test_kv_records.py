"""mem/kv_records.py: the joined form (PD's chunks) is byte for byte the per-record form (the tiers'), both ways,
and a refused write leaves the pool as it was."""

from __future__ import annotations

import pytest
import torch

from radixlang_runtime.mem.kv_pool import KVPool
from radixlang_runtime.mem.kv_records import KVRecordPort


def pool(dtype: torch.dtype = torch.bfloat16) -> KVPool:
    p = KVPool(48, 3, 2, 8, dtype, torch.device("cpu"), 1, 48)
    p.block.copy_(torch.randn(p.block.shape).to(dtype))
    return p


@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_joined_equals_records_both_ways(t, dtype):
    src = pool(dtype)
    port = KVRecordPort(src, t)
    slots = [5, 9, 1, 40, 41, 2, 33, 7][:(8 // t) * t]
    recs = port.read_records(slots)
    assert len(recs) == len(slots) // t and all(len(r) == port.record_bytes for r in recs)
    joined = port.read_joined(slots)
    assert joined == b"".join(recs)

    a, b = pool(dtype), pool(dtype)
    b.block.copy_(a.block)
    dst = [10, 11, 12, 13, 20, 21, 22, 23][:len(slots)]
    KVRecordPort(a, t).write_records(dst, recs)
    KVRecordPort(b, t).write_joined(dst, joined)
    assert torch.equal(a.block, b.block)
    assert torch.equal(a.block[:, :, :, dst], src.block[:, :, :, slots])
    one = KVRecordPort(b, t)  # a single record: unpack_records views the bytes (read-only) and copies from them
    one.write_joined(dst[:t], recs[-1])
    assert torch.equal(b.block[:, :, :, dst[:t]], src.block[:, :, :, slots[-t:]])


def test_refused_writes_leave_the_pool_whole():
    p = pool()
    port = KVRecordPort(p, 2)
    recs = port.read_records([0, 1, 2, 3])
    before = p.block.clone()
    with pytest.raises(ValueError, match="write_joined"):
        port.write_joined([10, 11, 12, 13], b"".join(recs)[:-2])  # not whole records
    with pytest.raises(ValueError, match="write_joined"):
        port.write_joined([10, 11, 12], b"".join(recs))  # slots are not n * t
    with pytest.raises(ValueError, match="payloads of"):
        port.write_records([10, 11, 12, 13], [recs[0], recs[1][:-1]])
    assert torch.equal(p.block, before)


def test_slot_runs():
    from radixlang_runtime.mem.kv_records import slot_runs

    assert slot_runs([]) == []
    assert slot_runs([4, 5, 6, 9, 3, 4, 0]) == [(0, 4, 3), (3, 9, 1), (4, 3, 2), (6, 0, 1)]


@pytest.mark.parametrize("layout", ["pages", "scattered"])
def test_one_token_writes_by_runs_and_by_index_copy(layout):
    """PD's one-token records: slots in page runs take the per-run copy, scattered ones index_copy_; both put
    each record's K/V at its slot."""
    src = pool()
    slots = list(range(16))
    joined = KVRecordPort(src, 1).read_joined(slots)
    dst = [30, 31, 32, 33, 34, 35, 36, 37, 8, 9, 10, 11, 12, 13, 14, 15] if layout == "pages" else \
        [30, 2, 17, 5, 44, 21, 8, 39, 12, 26, 0, 47, 33, 19, 6, 41]
    p = pool()
    want = p.block.clone()
    want[:, :, :, dst] = src.block[:, :, :, slots]
    KVRecordPort(p, 1).write_joined(dst, joined)
    assert torch.equal(p.block, want)
