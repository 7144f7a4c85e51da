"""Cascade (shared-prefix) decode attention in Triton against kernels/reference.py: the shared part
alone, the shared part merged into decode (= one pass over the whole sequence), and the backend
with cascade on and off (interpreted on CPU: TRITON_INTERPRET=1, set in conftest when there is no GPU)."""

from __future__ import annotations

import random

import pytest
import torch

triton = pytest.importorskip("triton")

from radixlang_kernels.decode_attention import decode_attention  # noqa: E402
from radixlang_kernels.prefix_attention import shared_prefix_attention  # noqa: E402
from radixlang_kernels.reference import paged_attention_ref, prefix_attention_ref  # noqa: E402
from radixlang_runtime.model.layers.attention.cascade import plan_cascade  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}  # as in test_triton_kernels

# Two shared prefixes (50 and 70 positions). Request (prefix, taken, length): its first `taken`
# positions are the prefix's first slots, the rest on its own pages. The planner groups requests
# 0-2 (P = 50) and 3-4 (P = 40: request 4 takes 40); 5 shares nothing; 6 shares 8 slots with
# group 0, too few (< min_shared) to join it.
PREFIXES = [50, 70]
REQS = [(0, 50, 57), (0, 50, 51), (0, 50, 63), (1, 70, 74), (1, 40, 60), (None, 0, 30), (0, 8, 68)]
NEW = [5, 9, 3, 2, 4, 1, 6]  # extend-like query rows per request for the shared part alone (group 0: 17 rows)
CASES = [(9, 3, 64, torch.float32, 1, 0.0), (9, 3, 64, torch.float32, 16, 0.0), (9, 3, 64, torch.bfloat16, 1, 0.0),
         (9, 3, 64, torch.bfloat16, 16, 0.0), (8, 2, 80, torch.bfloat16, 16, 0.0), (9, 3, 64, torch.float32, 16, 5.0)]
IDS = ["f32-p1", "f32-p16", "bf16-p1", "bf16-p16", "d80-bf16-p16", "softcap-f32-p16"]


def shared_setup(hkv, D, dtype, page_size, seed, prefixes=PREFIXES, reqs=REQS):
    """A pool whose prefixes and requests' own positions sit on shuffled pages; table rows shuffled.
    Returns k_buffer, v_buffer [hkv, N, D], req_to_token [len(reqs), ctx], rows, lens."""
    g = torch.Generator().manual_seed(seed)
    npages = lambda n: -(-n // page_size)  # noqa: E731
    total = sum(npages(p) for p in prefixes) + sum(npages(L - t) for _, t, L in reqs) + 4
    kb = torch.randn(hkv, total * page_size, D, generator=g).to(dtype)
    vb = torch.randn(hkv, total * page_size, D, generator=g).to(dtype)
    pages = torch.randperm(total, generator=g).tolist()

    def take(n: int) -> list[int]:
        mine = [pages.pop() for _ in range(npages(n))]
        return [mine[i // page_size] * page_size + i % page_size for i in range(n)]

    prefix_slots = [take(p) for p in prefixes]
    lens = [L for _, _, L in reqs]
    rows = list(range(len(reqs)))
    random.Random(seed).shuffle(rows)
    rt = torch.zeros(len(reqs), max(lens) + 8, dtype=torch.int64)
    for r, (p, t, L) in zip(rows, reqs):
        rt[r, :L] = torch.tensor((prefix_slots[p][:t] if p is not None else []) + take(L - t))
    return kb, vb, rt, rows, lens


def dev(*xs):
    return [x.to(DEVICE) for x in xs]


@pytest.mark.parametrize("H,hkv,D,dtype,page_size,cap", CASES, ids=IDS)
def test_shared_prefix_matches_reference(H, hkv, D, dtype, page_size, cap):
    kb, vb, rt, rows, lens = shared_setup(hkv, D, dtype, page_size, seed=D + page_size)
    starts = [sum(NEW[:i]) for i in range(len(NEW))]
    plan = plan_cascade(rt, rows, [L - 1 for L in lens], starts, NEW, min_shared=16)
    assert plan.group_lens.tolist() == [50, 40] and plan.group_starts.tolist() == [0, 17, 23]
    T = sum(NEW)
    q = (torch.randn(T, H, D, generator=torch.Generator().manual_seed(3)) * (4 if cap else 1)).to(dtype)
    fields = (plan.group_rows, plan.group_lens, plan.q_index, plan.group_starts)
    o, lse = shared_prefix_attention(*dev(q, kb, vb, rt, *fields), D ** -0.5, cap, plan.max_group_rows,
                                     plan.max_shared)
    want_o, want_lse = prefix_attention_ref(q, kb, vb, rt, *[f.tolist() for f in fields], D ** -0.5, cap)
    assert o.dtype == dtype and o.shape == q.shape and lse.dtype == torch.float32 and lse.shape == (T, H)
    torch.testing.assert_close(o.float().cpu(), want_o, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(lse.cpu(), want_lse, atol=TOL[dtype], rtol=TOL[dtype])
    outside = torch.ones(T, dtype=torch.bool)
    outside[plan.q_index] = False
    assert outside.sum() == T - 23 and (o.cpu()[outside] == 0).all() and (lse.cpu()[outside] == float("-inf")).all()

    # in place into float32 buffers: grouped rows written, the others left as they were
    o2, lse2 = shared_prefix_attention(*dev(q, kb, vb, rt, *fields), D ** -0.5, cap,
                                       out_o=torch.full(q.shape, 7.0, device=DEVICE),
                                       out_lse=torch.full((T, H), 7.0, device=DEVICE))
    torch.testing.assert_close(o2.cpu()[~outside], want_o[~outside], atol=TOL[dtype], rtol=TOL[dtype])
    assert (o2.cpu()[outside] == 7.0).all() and (lse2.cpu()[outside] == 7.0).all()


@pytest.mark.parametrize("H,hkv,D,dtype,page_size,cap", CASES, ids=IDS)
def test_cascade_decode_matches_one_pass(H, hkv, D, dtype, page_size, cap):
    kb, vb, rt, rows, lens = shared_setup(hkv, D, dtype, page_size, seed=D + page_size)
    B = len(lens)
    q = (torch.randn(B, H, D, generator=torch.Generator().manual_seed(5)) * (4 if cap else 1)).to(dtype)
    qd, kbd, vbd, rtd = dev(q, kb, vb, rt)
    plan = plan_cascade(rtd, rows, [L - 1 for L in lens], list(range(B)), [1] * B, min_shared=16)
    assert plan.k_begin.tolist() == [50, 50, 50, 40, 40, 0, 0]
    prior_o, prior_lse = shared_prefix_attention(qd, kbd, vbd, rtd, plan.group_rows, plan.group_lens, plan.q_index,
                                                 plan.group_starts, D ** -0.5, cap, plan.max_group_rows,
                                                 plan.max_shared)  # prior in q's dtype
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=DEVICE)  # noqa: E731
    got = decode_attention(qd, kbd, vbd, rtd, t(rows), t(lens), D ** -0.5, cap, split_len=16,
                           k_begin=plan.k_begin, prior_o=prior_o, prior_lse=prior_lse)
    want = paged_attention_ref(q, kb, vb, rt, rows, [L - 1 for L in lens], [1] * B, D ** -0.5, cap)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.float().cpu(), want, atol=TOL[dtype], rtol=TOL[dtype])


def test_decode_k_begin_edges():
    """k_begin 0 with an empty prior (lse -inf), k_begin = seq_len (the prior alone), and between."""
    H, hkv, D = 8, 2, 64
    kb, vb, rt, rows, lens = shared_setup(hkv, D, torch.float32, 1, seed=9)
    rows, lens = rows[:4], lens[:4]
    begin = [0, lens[1], 17, 33]
    q = torch.randn(4, H, D, generator=torch.Generator().manual_seed(2))
    prior_o, prior_lse = prefix_attention_ref(q, kb, vb, rt, rows, begin, [0, 1, 2, 3], [0, 1, 2, 3, 4], D ** -0.5)
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=DEVICE)  # noqa: E731
    got = decode_attention(*dev(q, kb, vb, rt), t(rows), t(lens), D ** -0.5, split_len=16, k_begin=t(begin),
                           prior_o=prior_o.to(DEVICE), prior_lse=prior_lse.to(DEVICE))
    want = paged_attention_ref(q, kb, vb, rt, rows, [L - 1 for L in lens], [1] * 4, D ** -0.5)
    torch.testing.assert_close(got.cpu(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_backend_cascade_on_off(dtype):
    """The Triton backend's decode with cascade on (groups of >= MIN_SHARED = 64) and off agree."""
    from radixlang_runtime.mem.kv_pool import KVPool
    from radixlang_runtime.model.layers.attention.triton_backend import TritonAttentionBackend
    from radixlang_runtime.model.executor.forward_batch import ForwardBatch

    H, hkv, D = 9, 3, 64
    # requests 0, 2, 4 share 66 positions (one group); 3 and 5 share 40 (< MIN_SHARED), 1 nothing
    reqs = [(0, 66, 70), (None, 0, 20), (0, 66, 67), (1, 40, 50), (0, 66, 80), (1, 40, 45)]
    kb, vb, rt, rows, lens = shared_setup(hkv, D, dtype, 16, seed=4, prefixes=[66, 40], reqs=reqs)
    B = len(lens)
    pool = KVPool(kb.shape[1], 1, hkv, D, dtype, torch.device(DEVICE), table_rows=B, context_len=rt.shape[1])
    pool.k_buffers[0].copy_(kb)
    pool.v_buffers[0].copy_(vb)
    pool.req_to_token.copy_(rt)
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(B, h, D, generator=g).to(dtype).to(DEVICE) for h in (H, hkv, hkv))
    seq = torch.tensor(lens)
    fb = ForwardBatch(phase="decode", batch_size=B, input_ids=torch.zeros(B, dtype=torch.long, device=DEVICE),
                      positions=(seq - 1).to(DEVICE), out_loc=rt[rows, seq - 1].to(DEVICE),
                      req_rows=torch.tensor(rows, device=DEVICE), seq_lens=seq.to(DEVICE), seq_lens_cpu=lens,
                      prefix_lens_cpu=[L - 1 for L in lens], extend_lens_cpu=[1] * B, kv_pool=pool)
    outs = []
    for cascade in (True, False):
        backend = TritonAttentionBackend(H, hkv, D, D ** -0.5)
        backend.cascade = cascade
        backend.init_forward_metadata(fb)
        if cascade:
            assert fb.attn_meta.cascade.group_lens.tolist() == [66] and fb.attn_meta.cascade.max_group_rows == 3
        outs.append(backend.forward(q, k, v, 0, fb).view(B, H, D).float().cpu())
    assert fb.attn_meta.cascade is None
    want = paged_attention_ref(q.cpu(), pool.k_buffers[0].cpu(), pool.v_buffers[0].cpu(), rt, rows,
                               [L - 1 for L in lens], [1] * B, D ** -0.5)
    torch.testing.assert_close(outs[0], want, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(outs[0], outs[1], atol=TOL[dtype], rtol=TOL[dtype])
