"""The Triton extend and decode kernels against kernels/reference.py (interpreted on CPU:
TRITON_INTERPRET=1 where there is no GPU: radixlang_kernels.testing)."""

from __future__ import annotations

import random

import pytest
import torch

from radixlang_kernels.testing import interpret_triton_without_gpu  # noqa: E402

interpret_triton_without_gpu()  # before triton's import
triton = pytest.importorskip("triton")

from radixlang_kernels.decode_attention import decode_attention  # noqa: E402
from radixlang_kernels.extend_attention import extend_attention  # noqa: E402
from radixlang_kernels.reference import paged_attention_ref  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# float32 agrees to rounding; half types: inputs are rounded the same way for both sides, the
# kernel accumulates in float32 but p is rounded before P.V on GPUs (tl.dot inputs), the reference not.
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def paged_setup(prefix_lens, extend_lens, hkv, D, dtype, page_size, seed):
    """A pool with each request's positions on its own shuffled pages, as the allocator lays them out."""
    g = torch.Generator().manual_seed(seed)
    total = sum(-(-(p + n) // page_size) for p, n in zip(prefix_lens, extend_lens)) + 4
    N = total * page_size
    kb = torch.randn(hkv, N, D, generator=g).to(dtype)
    vb = torch.randn(hkv, N, D, generator=g).to(dtype)
    ctx = max(p + n for p, n in zip(prefix_lens, extend_lens))
    rows = list(range(len(prefix_lens)))
    random.Random(seed).shuffle(rows)
    rt = torch.zeros(len(rows), ctx + 8, dtype=torch.int64)
    pages = torch.randperm(total, generator=g).tolist()
    for r, p, n in zip(rows, prefix_lens, extend_lens):
        mine = [pages.pop() for _ in range(-(-(p + n) // page_size))]
        rt[r, : p + n] = torch.tensor([mine[i // page_size] * page_size + i % page_size for i in range(p + n)])
    return kb, vb, rt, rows


# Llama-8B's heads on a GPU; interpreted, the same head size and GQA ratio over a quarter of the heads (the
# interpreter's time grows with the grid, and more heads run the same program more times)
CONFIGS = [(9, 3, 64), (32, 8, 128) if DEVICE == "cuda" else (8, 2, 128), (8, 2, 80)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("H,hkv,D", CONFIGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_extend_matches_reference(H, hkv, D, dtype, page_size):
    prefix_lens, extend_lens = [0, 37, 1, 120, 0], [5, 1, 64, 17, 33]
    kb, vb, rt, rows = paged_setup(prefix_lens, extend_lens, hkv, D, dtype, page_size, seed=H + D)
    T = sum(extend_lens)
    g = torch.Generator().manual_seed(7)
    qkv = torch.randn(T, H + 2 * hkv, D, generator=g).to(dtype)  # strided views of a fused projection
    q, k, v = qkv[:, :H], qkv[:, H : H + hkv], qkv[:, H + hkv :]
    start = 0
    for r, p, n in zip(rows, prefix_lens, extend_lens):  # the new K/V are stored before attention
        kb[:, rt[r, p : p + n]] = k[start : start + n].transpose(0, 1)
        vb[:, rt[r, p : p + n]] = v[start : start + n].transpose(0, 1)
        start += n
    starts = torch.tensor([sum(extend_lens[:i]) for i in range(len(extend_lens))])
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=DEVICE)  # noqa: E731
    dev = lambda x: x.to(DEVICE)  # noqa: E731
    got = extend_attention(dev(q), dev(k), dev(v), dev(kb), dev(vb), dev(rt), t(rows), t(prefix_lens), t(extend_lens),
                           dev(starts), D ** -0.5)
    want = paged_attention_ref(q, kb, vb, rt, rows, prefix_lens, extend_lens, D ** -0.5)
    assert got.dtype == dtype and got.shape == (T, H, D)
    torch.testing.assert_close(got.float().cpu(), want, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("H,hkv,D", CONFIGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_matches_reference(H, hkv, D, dtype, page_size):
    seq_lens = [1, 300, 17, 64, 129]
    kb, vb, rt, rows = paged_setup([n - 1 for n in seq_lens], [1] * len(seq_lens), hkv, D, dtype, page_size, seed=D)
    q = torch.randn(len(seq_lens), H, D, generator=torch.Generator().manual_seed(3)).to(dtype)
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=DEVICE)  # noqa: E731
    got = decode_attention(q.to(DEVICE), kb.to(DEVICE), vb.to(DEVICE), rt.to(DEVICE), t(rows), t(seq_lens),
                           D ** -0.5, split_len=64)
    want = paged_attention_ref(q, kb, vb, rt, rows, [n - 1 for n in seq_lens], [1] * len(seq_lens), D ** -0.5)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.float().cpu(), want, atol=TOL[dtype], rtol=TOL[dtype])


def test_soft_cap_in_both_kernels():
    H, hkv, D, cap = 8, 2, 64, 5.0
    seq_lens = [40, 3]
    kb, vb, rt, rows = paged_setup([n - 1 for n in seq_lens], [1, 1], hkv, D, torch.float32, 1, seed=1)
    q = torch.randn(2, H, D) * 4  # large scores, so the cap matters
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=DEVICE)  # noqa: E731
    d = lambda *xs: [x.to(DEVICE) for x in xs]  # noqa: E731
    got = decode_attention(*d(q, kb, vb, rt), t(rows), t(seq_lens), D ** -0.5, soft_cap=cap).cpu()
    want = paged_attention_ref(q, kb, vb, rt, rows, [n - 1 for n in seq_lens], [1, 1], D ** -0.5, soft_cap=cap)
    uncapped = paged_attention_ref(q, kb, vb, rt, rows, [n - 1 for n in seq_lens], [1, 1], D ** -0.5)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    assert (want - uncapped).abs().max() > 1e-2
    prefix, ext = [10, 0], [6, 9]
    kb, vb, rt, rows = paged_setup(prefix, ext, hkv, D, torch.float32, 16, seed=2)
    qkv = torch.randn(15, H + 2 * hkv, D) * 4
    q, k, v = qkv[:, :H], qkv[:, H : H + hkv], qkv[:, H + hkv :]
    start = 0
    for r, p, n in zip(rows, prefix, ext):
        kb[:, rt[r, p : p + n]] = k[start : start + n].transpose(0, 1)
        vb[:, rt[r, p : p + n]] = v[start : start + n].transpose(0, 1)
        start += n
    got = extend_attention(*d(q, k, v, kb, vb, rt), t(rows), t(prefix), t(ext), t([0, 6]), D ** -0.5,
                           soft_cap=cap).cpu()
    want = paged_attention_ref(q, kb, vb, rt, rows, prefix, ext, D ** -0.5, soft_cap=cap)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def _store_new_tokens(kb, vb, rt, rows, prefix, ext, H, hkv, D):
    """Random q / k / v of the requests' new tokens (seed 5); k and v written into the pool at their slots."""
    qkv = torch.randn(sum(ext), H + 2 * hkv, D, generator=torch.Generator().manual_seed(5))
    q, k, v = qkv[:, :H], qkv[:, H : H + hkv], qkv[:, H + hkv :]
    start = 0
    for r, p, n in zip(rows, prefix, ext):
        kb[:, rt[r, p : p + n]] = k[start : start + n].transpose(0, 1)
        vb[:, rt[r, p : p + n]] = v[start : start + n].transpose(0, 1)
        start += n
    return q, k, v


@pytest.mark.parametrize("window", [1, 7, 40])
@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (8, 2, 80)])
def test_sliding_window_in_both_kernels(H, hkv, D, window):
    """Sliding windows (the query at position p sees (p - window, p]): extend bounds its key loops by the
    window (blocks of 16 queries, so a window cuts inside and across blocks); decode reads the last
    `window` positions through k_begin, as the backend calls it."""
    prefix, ext = [0, 37, 3, 70], [45, 20, 1, 9]
    kb, vb, rt, rows = paged_setup(prefix, ext, hkv, D, torch.float32, 16, seed=window)
    q, k, v = _store_new_tokens(kb, vb, rt, rows, prefix, ext, H, hkv, D)
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=DEVICE)  # noqa: E731
    d = lambda *xs: [x.to(DEVICE) for x in xs]  # noqa: E731
    starts = [sum(ext[:i]) for i in range(len(ext))]
    got = extend_attention(*d(q, k, v, kb, vb, rt), t(rows), t(prefix), t(ext), t(starts), D ** -0.5,
                           block_m=16, block_n=16, window=window).cpu()
    want = paged_attention_ref(q, kb, vb, rt, rows, prefix, ext, D ** -0.5, window=window)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    seq = [p + n for p, n in zip(prefix, ext)]
    qd = torch.randn(len(seq), H, D, generator=torch.Generator().manual_seed(6))
    got = decode_attention(*d(qd, kb, vb, rt), t(rows), t(seq), D ** -0.5, split_len=16,
                           k_begin=t([max(0, n - window) for n in seq])).cpu()
    want = paged_attention_ref(qd, kb, vb, rt, rows, [n - 1 for n in seq], [1] * len(seq), D ** -0.5, window=window)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("chunk", [1, 8, 20])
@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (4, 2, 16)])
def test_chunked_attention_in_both_kernels(H, hkv, D, chunk):
    """Chunked local attention (the query at position p sees [p - p % chunk, p]): extend bounds and masks its
    key loops by each query's chunk (blocks of 16 queries, chunks cutting inside and across blocks and the
    cached prefix); decode reads the new token's chunk through k_begin, as the backend calls it."""
    prefix, ext = [0, 37, 3, 70, 16], [45, 20, 1, 9, 5]
    kb, vb, rt, rows = paged_setup(prefix, ext, hkv, D, torch.float32, 16, seed=chunk)
    q, k, v = _store_new_tokens(kb, vb, rt, rows, prefix, ext, H, hkv, D)
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=DEVICE)  # noqa: E731
    d = lambda *xs: [x.to(DEVICE) for x in xs]  # noqa: E731
    starts = [sum(ext[:i]) for i in range(len(ext))]
    got = extend_attention(*d(q, k, v, kb, vb, rt), t(rows), t(prefix), t(ext), t(starts), D ** -0.5,
                           block_m=16, block_n=16, chunk=chunk).cpu()
    want = paged_attention_ref(q, kb, vb, rt, rows, prefix, ext, D ** -0.5, chunk=chunk)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    # the chunk matters (every chunk here is shorter than the longest request): full causal attention differs
    assert not torch.allclose(want, paged_attention_ref(q, kb, vb, rt, rows, prefix, ext, D ** -0.5))
    seq = [p + n for p, n in zip(prefix, ext)]
    qd = torch.randn(len(seq), H, D, generator=torch.Generator().manual_seed(6))
    got = decode_attention(*d(qd, kb, vb, rt), t(rows), t(seq), D ** -0.5, split_len=16,
                           k_begin=t([(n - 1) // chunk * chunk for n in seq])).cpu()
    want = paged_attention_ref(qd, kb, vb, rt, rows, [n - 1 for n in seq], [1] * len(seq), D ** -0.5, chunk=chunk)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    with pytest.raises(ValueError, match="either in a window"):
        extend_attention(*d(q, k, v, kb, vb, rt), t(rows), t(prefix), t(ext), t(starts), D ** -0.5, window=4,
                         chunk=chunk)


@pytest.mark.skipif(DEVICE != "cuda", reason="a 17 GB pool: GPU only (gpu_check.sh)")
def test_kernels_address_a_pool_past_2_31_elements():
    """KV head 7 of an [8, 2^22 + 64, 128] bfloat16 pool starts past element 2^31 (7 x (2^22 + 64) x 128): the
    head offset is int64 (an int32 product faulted with an illegal address on an H200, bench_kernels' 256 x 16k)."""
    H, hkv, D, dtype, ctx = 16, 8, 128, torch.bfloat16, 64
    N = 2 ** 22 + 64
    kb = torch.zeros(hkv, N, D, dtype=dtype, device="cuda")
    vb = torch.zeros_like(kb)
    slots = torch.arange(N - ctx, N, device="cuda")  # the pool's last slots
    g = torch.Generator(device="cuda").manual_seed(0)
    kb[:, slots] = torch.randn(hkv, ctx, D, generator=g, device="cuda").to(dtype)
    vb[:, slots] = torch.randn(hkv, ctx, D, generator=g, device="cuda").to(dtype)
    rt = slots[None].clone()
    q = torch.randn(1, H, D, generator=g, device="cuda").to(dtype)
    t = lambda x: torch.tensor(x, dtype=torch.int64, device="cuda")  # noqa: E731
    got = decode_attention(q, kb, vb, rt, t([0]), t([ctx]), D ** -0.5)
    # the reference on the 64 slots alone (a pool of their own)
    small_k, small_v, small_rt = kb[:, slots].cpu(), vb[:, slots].cpu(), torch.arange(ctx)[None]
    want = paged_attention_ref(q.cpu(), small_k, small_v, small_rt, [0], [ctx - 1], [1], D ** -0.5)
    torch.testing.assert_close(got.float().cpu(), want, atol=TOL[dtype], rtol=TOL[dtype])
    qe = torch.randn(8, H, D, generator=g, device="cuda").to(dtype)  # extend: 8 new tokens over a 56-slot prefix
    got = extend_attention(qe, kb[:, slots[56:]].transpose(0, 1).contiguous(),
                           vb[:, slots[56:]].transpose(0, 1).contiguous(), kb, vb, rt, t([0]), t([56]), t([8]),
                           t([0]), D ** -0.5)
    want = paged_attention_ref(qe.cpu(), small_k, small_v, small_rt, [0], [56], [8], D ** -0.5)
    torch.testing.assert_close(got.float().cpu(), want, atol=TOL[dtype], rtol=TOL[dtype])
