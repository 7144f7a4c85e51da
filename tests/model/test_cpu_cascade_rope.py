"""The C kernels as the runtime drives them: cascade attention on groups found by the runtime's planner
(model/layers/attention/cascade.py plan_cascade, CascadePlan) and rope_store against the runtime's Rotary.apply +
KVPool.store (and without tables: a NoPE layer's store only), against radixlang_kernels/reference.py, once per
instruction set this machine has (the `isa` fixture), in bf16 and float32 (the kernels alone: kernels/tests/).
Skipped where no compiler exists."""

from __future__ import annotations

import pytest
import torch

from radixlang_kernels import cpu_ops
from radixlang_kernels.cpu_caps import detect
from radixlang_kernels.reference import paged_attention_ref

pytestmark = pytest.mark.skipif(detect().compiler is None, reason="no C compiler: torch fallback in use")


def _tol(dtype):
    return dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)


def _new_tokens(g, H, hkv, D, dtype, kb, vb, rt, rows, prefix_lens, extend_lens):
    """q, k, v of the new tokens (strided views of one qkv tensor, as the model passes), their K/V
    stored in the pool first at positions prefix_lens[i] .. of each row, as the model does."""
    qkv = torch.randn(sum(extend_lens), H + 2 * hkv, D, generator=g).to(dtype)
    q, k, v = qkv[:, :H], qkv[:, H : H + hkv], qkv[:, H + hkv :]
    start = 0
    for row, p, n in zip(rows, prefix_lens, extend_lens):
        kb[:, rt[row, p : p + n]] = k[start : start + n].transpose(0, 1)
        vb[:, rt[row, p : p + n]] = v[start : start + n].transpose(0, 1)
        start += n
    return q, k, v


def _shared_pool(g, hkv, D, dtype, page_size, groups, tails, rows, num_slots=2048):
    """A pool where requests share leading pages: groups[i] = (shared length, member indices); request r
    then owns its tail of tails[r] positions on pages of its own. Returns pools, req_to_token, seq lens."""
    kb = torch.randn(hkv, num_slots, D, generator=g).to(dtype)
    vb = torch.randn(hkv, num_slots, D, generator=g).to(dtype)
    rt = torch.zeros(max(rows) + 1, 512, dtype=torch.int64)
    pages = torch.randperm(num_slots // page_size, generator=g).tolist()

    def take(n: int) -> list[int]:
        mine = [pages.pop() for _ in range(-(-n // page_size))]
        return [mine[i // page_size] * page_size + i % page_size for i in range(n)]

    lens = list(tails)
    for shared, members in groups:
        common = take(shared)  # whole pages: a tail never writes into a shared page
        for m in members:
            lens[m] += shared
            rt[rows[m], :shared] = torch.tensor(common)
    for m, row in enumerate(rows):
        start = next((s for s, ms in groups if m in ms), 0)
        rt[row, start : lens[m]] = torch.tensor(take(lens[m] - start))
    return kb, vb, rt, lens


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (8, 2, 128), (6, 3, 13)])
def test_cascade_decode_matches_reference(isa, dtype, page_size, H, hkv, D):
    """Ragged groups (3 members sharing 80, 2 sharing 33, one request alone): the planner finds them
    from the slots, the shared part runs once per group, the decode kernel merges it: == one pass."""
    from radixlang_runtime.model.layers.attention.cascade import plan_cascade

    g = torch.Generator().manual_seed(4)
    rows = [5, 0, 3, 1, 4, 2]
    kb, vb, rt, lens = _shared_pool(g, hkv, D, dtype, page_size, [(80, [0, 2, 5]), (33, [1, 4])],
                                    [1, 7, 20, 40, 1, 3], rows)
    plan = plan_cascade(rt, rows, [n - 1 for n in lens], list(range(6)), [1] * 6, min_shared=16)
    assert plan is not None and plan.num_groups == 2
    # the planner compares slots: a group's shared part ends where its members' slots differ, i.e. at 33
    # and 80 on either page size (the tails start on pages of their own)
    assert sorted(plan.group_lens.tolist()) == [33, 80]
    q = torch.randn(6, H, D, generator=g).to(dtype)
    dp = isa == "avx512_bf16" and dtype == torch.bfloat16 and D % 32 == 0
    prior = cpu_ops.empty_prior(*q.shape, dtype)
    cpu_ops.shared_prefix(q, kb, vb, rt, plan, D ** -0.5, dp, prior)
    got = cpu_ops.paged_decode(q, kb, vb, rt, torch.tensor(rows), torch.tensor(lens), D ** -0.5, plan.k_begin,
                                   prior)
    want = paged_attention_ref(q, kb, vb, rt, rows, [n - 1 for n in lens], [1] * 6, D ** -0.5)
    torch.testing.assert_close(got.float(), want, **_tol(dtype))
    assert torch.isinf(prior[1][3]).all()  # request 3 is in no group: its prior weighs nothing


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (8, 2, 128), (6, 3, 13)])
def test_cascade_extend_matches_reference(isa, dtype, page_size, H, hkv, D):
    """Extend with cached prefixes shared by ragged groups (the shared part reads 150 query rows of
    one group: several query blocks read one packed prefix) == the one-pass reference."""
    from radixlang_runtime.model.layers.attention.cascade import plan_cascade

    g = torch.Generator().manual_seed(5)
    rows = [2, 0, 3, 1, 4]
    extend_lens = [150, 5, 1, 17, 30]
    cached_tails = [3, 0, 9, 20, 0]  # cached positions of each request past its group's shared part
    kb, vb, rt, seq = _shared_pool(g, hkv, D, dtype, page_size, [(64, [0, 1, 2]), (48, [3, 4])],
                                   [c + n for c, n in zip(cached_tails, extend_lens)], rows)
    prefix_lens = [s - n for s, n in zip(seq, extend_lens)]
    T = sum(extend_lens)
    q, k, v = _new_tokens(g, H, hkv, D, dtype, kb, vb, rt, rows, prefix_lens, extend_lens)
    starts = [sum(extend_lens[:i]) for i in range(5)]
    plan = plan_cascade(rt, rows, prefix_lens, starts, extend_lens, min_shared=16)
    assert plan is not None and plan.num_groups == 2 and plan.max_group_rows == 156
    dp = isa == "avx512_bf16" and dtype == torch.bfloat16 and D % 32 == 0
    prior = cpu_ops.empty_prior(*q.shape, dtype)
    cpu_ops.shared_prefix(q, kb, vb, rt, plan, D ** -0.5, dp, prior)
    prefix = cpu_ops.PagedPrefix(kb, vb, rt, torch.tensor(rows), torch.tensor(prefix_lens), plan.k_begin)
    got = cpu_ops.extend_causal(q, k, v, torch.tensor(starts), torch.tensor(extend_lens), D ** -0.5, prefix, dp,
                                    prior)
    want = paged_attention_ref(q, kb, vb, rt, rows, prefix_lens, extend_lens, D ** -0.5)
    torch.testing.assert_close(got.view(T, H, D).float(), want, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_shared_prefix_lse_and_merge_rule(isa, dtype):
    """The shared part's log-sum-exp is the scores' (checked against torch), and merging two halves of
    a sequence with the reference merge_states gives attention over the whole."""
    from radixlang_kernels.reference import merge_states
    from radixlang_runtime.model.layers.attention.cascade import CascadePlan

    g = torch.Generator().manual_seed(6)
    H, hkv, D, L = 4, 2, 64, 90
    kb = torch.randn(hkv, 256, D, generator=g).to(dtype)
    vb = torch.randn(hkv, 256, D, generator=g).to(dtype)
    rt = torch.randperm(256, generator=g)[:L].view(1, L).clone()
    q = torch.randn(3, H, D, generator=g).to(dtype)
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    plan = CascadePlan(t([0]), t([50]), t([0, 2]), t([0, 2]), t([2]), t([50, 0, 50]), 2, 50)
    dp = isa == "avx512_bf16" and dtype == torch.bfloat16
    o, lse = cpu_ops.empty_prior(*q.shape, dtype)
    cpu_ops.shared_prefix(q, kb, vb, rt, plan, D ** -0.5, dp, (o, lse))
    k = kb[:, rt[0, :50]].float().repeat_interleave(H // hkv, 0)  # [H, 50, D]
    s = torch.einsum("bhd,hld->bhl", q.float(), k) * D ** -0.5
    torch.testing.assert_close(lse[[0, 2]], torch.logsumexp(s[[0, 2]], -1), **_tol(dtype))
    assert torch.isinf(lse[1]).all()
    # the second half through the decode kernel's own part, merged by the reference rule
    own = cpu_ops.paged_decode(q[[0]], kb, vb, rt, t([0]), t([L]), D ** -0.5, t([50]))
    v = vb[:, rt[0, 50:]].float().repeat_interleave(H // hkv, 0)
    k2 = kb[:, rt[0, 50:]].float().repeat_interleave(H // hkv, 0)
    lse2 = torch.logsumexp(torch.einsum("hd,hld->hl", q[0].float(), k2) * D ** -0.5, -1)
    merged = merge_states(o[[0]], lse[[0]], own, lse2[None])
    want = paged_attention_ref(q[[0]], kb, vb, rt, [0], [L - 1], [1], D ** -0.5)
    torch.testing.assert_close(merged, want, **_tol(dtype))
    del v


_ROPE_CONFIGS = {"default": {}, "yarn": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                           "original_max_position_embeddings": 1024}}}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("T,H,hkv,D", [(1, 9, 3, 64), (100, 9, 3, 64), (70, 4, 2, 32), (5, 8, 8, 128)])
@pytest.mark.parametrize("rope", ["default", "yarn"])
def test_rope_store_is_bit_identical_to_rotary_and_store(isa, dtype, T, H, hkv, D, rope):
    """rope_store == Rotary.apply + KVPool.store, bit for bit (T >= 64 takes the threaded loop); qkv rows
    with a stride wider than their heads (a padded buffer) and scattered slots. yarn: tables scaled by
    its attention factor (the kernel reads whatever tables Rotary built)."""
    from radixlang_runtime.mem.kv_pool import KVPool
    from radixlang_runtime.model.models.llama import Rotary
    from radixlang_runtime.model.layers.rope_spec import parse_rope

    g = torch.Generator().manual_seed(5)
    width = (H + 2 * hkv) * D
    buf = (torch.randn(T, width + 8, generator=g) * 4).to(dtype)
    qkv = buf[:, :width]
    spec = parse_rope({"rope_theta": 10000.0, "max_position_embeddings": 4096, **_ROPE_CONFIGS[rope]}, D)
    rot = Rotary(spec, 4096, torch.device("cpu"), dtype)
    cos, sin = rot.cos_sin(torch.randint(0, 4096, (T,), generator=g))
    slots = torch.randperm(300, generator=g)[:T]
    pools = [KVPool(300, 1, hkv, D, dtype, torch.device("cpu"), 1, 8) for _ in range(2)]

    heads = qkv.reshape(T, H + 2 * hkv, D)
    want = Rotary.apply(heads[:, : H + hkv], (cos, sin))
    pools[0].store(0, slots, want[:, H:], heads[:, H + hkv :])
    got = qkv.clone()
    cpu_ops.rope_store(got, cos, sin, H, hkv, D, slots, pools[1].k_buffers[0], pools[1].v_buffers[0])
    got = got.view(T, H + 2 * hkv, D)
    assert torch.equal(got[:, : H + hkv], want)
    assert torch.equal(got[:, H + hkv :], heads[:, H + hkv :])  # v untouched
    assert torch.equal(pools[1].k_buffers[0], pools[0].k_buffers[0])
    assert torch.equal(pools[1].v_buffers[0], pools[0].v_buffers[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("T", [3, 80])
def test_rope_store_without_tables_only_stores(isa, dtype, T):
    """A NoPE layer's call (no cos / sin): q and k stay as they are, k and v go into the pool (KVPool.store)."""
    from radixlang_runtime.mem.kv_pool import KVPool

    H, hkv, D = 4, 2, 32
    g = torch.Generator().manual_seed(7)
    qkv = torch.randn(T, (H + 2 * hkv) * D, generator=g).to(dtype)
    heads = qkv.view(T, H + 2 * hkv, D).clone()
    slots = torch.randperm(200, generator=g)[:T]
    pools = [KVPool(200, 1, hkv, D, dtype, torch.device("cpu"), 1, 8) for _ in range(2)]
    pools[0].store(0, slots, heads[:, H : H + hkv], heads[:, H + hkv :])
    cpu_ops.rope_store(qkv, None, None, H, hkv, D, slots, pools[1].k_buffers[0], pools[1].v_buffers[0])
    assert torch.equal(qkv.view(T, H + 2 * hkv, D), heads)
    assert torch.equal(pools[1].k_buffers[0], pools[0].k_buffers[0])
    assert torch.equal(pools[1].v_buffers[0], pools[0].v_buffers[0])
