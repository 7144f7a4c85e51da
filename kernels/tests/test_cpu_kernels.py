"""The C attention, norm and activation kernels called directly, against plain torch math and
radixlang_kernels/reference.py, once per instruction set this machine has (the `isa` fixture,
radixlang_kernels/testing.py), in bf16 and float32. Cascade attention driven by the runtime's planner and
rope_store against the runtime's Rotary + KVPool: tests/model/test_cpu_cascade_rope.py; the linears' kernels:
tests/model/test_cpu_linears.py. Skipped where no compiler exists."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlang_kernels import cpu_ops
from radixlang_kernels.cpu_caps import detect
from radixlang_kernels.reference import paged_attention_ref
from radixlang_kernels.testing import isas, use_isa_library

pytestmark = pytest.mark.skipif(detect().compiler is None, reason="no C compiler: torch fallback in use")


@pytest.fixture(params=isas())
def isa(request, monkeypatch):
    return use_isa_library(request.param, monkeypatch)

def _tol(dtype):
    return dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_add_rms_norm_and_silu_mul(isa, dtype):
    g = torch.Generator().manual_seed(0)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    for T, H in [(7, 576), (3, 13), (2, 40)]:
        r = torch.randn(T, H, generator=g).to(dtype)
        x = torch.randn(T, H, generator=g).to(dtype)
        w = torch.randn(H, generator=g).to(dtype)
        want_r = r + x
        want = F.rms_norm(want_r.float(), (H,), w.float(), 1e-5)
        got = cpu_ops.add_rms_norm(x, r, w, 1e-5)
        assert got.dtype == dtype
        assert torch.equal(r, want_r)  # the residual is updated in place, rounded like torch's add
        torch.testing.assert_close(got.float(), want, **tol)
        torch.testing.assert_close(cpu_ops.add_rms_norm(None, r, w, 1e-5).float(), want, **tol)
        gu = 4 * torch.randn(T, 2 * H, generator=g).to(dtype)
        want = F.silu(gu[:, :H].float()) * gu[:, H:].float()
        torch.testing.assert_close(cpu_ops.silu_mul(gu).float(), want, **tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("lens", [[7, 7, 7], [5, 1, 40, 17], [300]])
@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (8, 2, 128), (6, 3, 13)])
def test_extend_causal_matches_sdpa(isa, dtype, lens, H, hkv, D):
    g = torch.Generator().manual_seed(1)
    T = sum(lens)
    qkv = torch.randn(T, H + 2 * hkv, D, generator=g).to(dtype)  # strided views, as the model passes
    q, k, v = qkv[:, :H], qkv[:, H : H + hkv], qkv[:, H + hkv :]
    starts = torch.tensor([sum(lens[:i]) for i in range(len(lens))])
    for dp in {False, isa == "avx512_bf16" and dtype == torch.bfloat16 and D % 32 == 0}:
        got = cpu_ops.extend_causal(q, k, v, starts, torch.tensor(lens), D ** -0.5, dpbf16=dp)
        for s, n in zip(starts.tolist(), lens):
            want = F.scaled_dot_product_attention(
                q[s : s + n].float().transpose(0, 1), k[s : s + n].float().transpose(0, 1),
                v[s : s + n].float().transpose(0, 1), is_causal=True, enable_gqa=True).transpose(0, 1)
            torch.testing.assert_close(got[s : s + n].view(n, H, D).float(), want, **_tol(dtype))


def _scattered_pool(g, hkv, D, dtype, page_size, rows, lens, num_slots=1024):
    """K/V pools of random (stale) data and a req_to_token whose requests own shuffled whole pages."""
    kb = torch.randn(hkv, num_slots, D, generator=g).to(dtype)
    vb = torch.randn(hkv, num_slots, D, generator=g).to(dtype)
    rt = torch.zeros(max(rows) + 1, 512, dtype=torch.int64)
    pages = torch.randperm(num_slots // page_size, generator=g).tolist()
    for row, n in zip(rows, lens):
        mine = [pages.pop() for _ in range(-(-n // page_size))]
        rt[row, :n] = torch.tensor([mine[i // page_size] * page_size + i % page_size for i in range(n)])
    return kb, vb, rt


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (8, 2, 128), (6, 3, 13)])
def test_extend_with_paged_prefix_matches_reference(isa, dtype, page_size, H, hkv, D):
    """Prefixes read in place through req_to_token (scattered slots), new tokens from q/k/v."""
    g = torch.Generator().manual_seed(2)
    prefix_lens, extend_lens, rows = [0, 33, 1, 200, 16], [5, 1, 40, 17, 16], [3, 0, 4, 1, 2]
    kb, vb, rt = _scattered_pool(g, hkv, D, dtype, page_size, rows, [p + n for p, n in zip(prefix_lens, extend_lens)])
    T = sum(extend_lens)
    q, k, v = _new_tokens(g, H, hkv, D, dtype, kb, vb, rt, rows, prefix_lens, extend_lens)
    starts = torch.tensor([sum(extend_lens[:i]) for i in range(5)])
    prefix = cpu_ops.PagedPrefix(kb, vb, rt, torch.tensor(rows), torch.tensor(prefix_lens))
    want = paged_attention_ref(q, kb, vb, rt, rows, prefix_lens, extend_lens, D ** -0.5)
    for dp in {False, isa == "avx512_bf16" and dtype == torch.bfloat16 and D % 32 == 0}:
        got = cpu_ops.extend_causal(q, k, v, starts, torch.tensor(extend_lens), D ** -0.5, prefix, dpbf16=dp)
        torch.testing.assert_close(got.view(T, H, D).float(), want, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("page_size", [1, 16])
# (16, 1, 32), (10, 2, 64), (4, 2, 48): the PV pass's query-head blocks of 8 / 4 + 1 / the generic
# width; seq_lens cover the score pass's partial blocks of 16 (1, 5) and whole ones (16, 200 = 12.5)
@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (8, 2, 128), (6, 3, 13), (16, 1, 32), (10, 2, 64), (4, 2, 48)])
def test_paged_decode_matches_reference(isa, dtype, page_size, H, hkv, D):
    g = torch.Generator().manual_seed(3)
    seq_lens, rows = [1, 37, 200, 16, 5], [2, 0, 4, 1, 3]
    kb, vb, rt = _scattered_pool(g, hkv, D, dtype, page_size, rows, seq_lens)
    q = torch.randn(len(rows), H, D, generator=g).to(dtype)
    got = cpu_ops.paged_decode(q, kb, vb, rt, torch.tensor(rows), torch.tensor(seq_lens), D ** -0.5)
    want = paged_attention_ref(q, kb, vb, rt, rows, [s - 1 for s in seq_lens], [1] * len(rows), D ** -0.5)
    torch.testing.assert_close(got.float(), want, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("H,C,R", [(16, 64, 16), (20, 32, 8), (3, 13, 6)])
def test_mla_decode_matches_reference(isa, dtype, H, C, R):
    """Ragged rows (one of length 1), head counts past and under one block of 16, odd widths, shuffled slots."""
    from radixlang_kernels.reference import mla_decode_ref

    torch.manual_seed(0)
    N, ctx, lens = 256, 96, [5, 1, 90, 33]
    pool = torch.randn(N, C + R).to(dtype)
    q = torch.randn(len(lens), H, C + R).to(dtype)
    table = torch.stack([torch.randperm(N)[:ctx] for _ in range(6)])
    rows, seq = torch.tensor([4, 0, 2, 5]), torch.tensor(lens)
    scale = (C + R) ** -0.5
    got = cpu_ops.mla_decode(q, pool, table, rows, seq, C, scale)
    want = mla_decode_ref(q, pool, table, rows, seq, C, scale)
    torch.testing.assert_close(got.float(), want.float(), **_tol(dtype))
    with pytest.raises(RuntimeError, match="mla_decode"):
        cpu_ops.mla_decode(q, pool, table, rows, torch.tensor([5, 1, ctx + 1, 33]), C, scale)
