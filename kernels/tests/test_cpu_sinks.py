"""Attention sinks on the C kernels (cpu_ops' sinks=: a prior of value 0 whose log-sum-exp is the sink) against
the torch reference (reference.paged_attention_ref with sinks): decode, decode over a window, extend with and
without cached prefixes and windows, decode rows through the extend kernel, and a sink merged into cascade
attention's shared part. Each on every instruction set this CPU has (the `isa` fixture)."""

from __future__ import annotations

import pytest
import torch

from radixlang_kernels import cpu_ops
from radixlang_kernels.cpu_caps import detect
from radixlang_kernels.reference import paged_attention_ref, prefix_attention_ref
from radixlang_kernels.testing import isas, use_isa_library

pytestmark = pytest.mark.skipif(detect().compiler is None, reason="no C compiler: torch fallback in use")
SHAPES = [(8, 2, 64), (6, 3, 13)]  # H, Hkv, D


@pytest.fixture(params=isas())
def isa(request, monkeypatch):
    return use_isa_library(request.param, monkeypatch)


def _tol(dtype):
    return dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)


def _pool(g, hkv, D, dtype, rows, lens, num_slots=512):
    """K/V pools of random data; each request's positions on shuffled slots."""
    kb = torch.randn(hkv, num_slots, D, generator=g).to(dtype)
    vb = torch.randn(hkv, num_slots, D, generator=g).to(dtype)
    rt = torch.zeros(max(rows) + 1, 256, dtype=torch.int64)
    free = torch.randperm(num_slots, generator=g).tolist()
    for row, n in zip(rows, lens):
        rt[row, :n] = torch.tensor([free.pop() for _ in range(n)])
    return kb, vb, rt


def _sinks(g, H):
    return torch.randn(H, generator=g) * 3  # large enough to take a visible share of the softmax


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("H,hkv,D", SHAPES)
@pytest.mark.parametrize("window", [0, 6])
def test_decode_with_sinks_matches_reference(isa, dtype, H, hkv, D, window):
    g = torch.Generator().manual_seed(4)
    seq_lens, rows = [1, 37, 100, 5], [2, 0, 3, 1]
    kb, vb, rt = _pool(g, hkv, D, dtype, rows, seq_lens)
    q = torch.randn(len(rows), H, D, generator=g).to(dtype)
    sinks = _sinks(g, H)
    lens = torch.tensor(seq_lens)
    begin = (lens - window).clamp(min=0) if window else None
    got = cpu_ops.paged_decode(q, kb, vb, rt, torch.tensor(rows), lens, D ** -0.5, begin, sinks=sinks)
    want = paged_attention_ref(q, kb, vb, rt, rows, [s - 1 for s in seq_lens], [1] * 4, D ** -0.5,
                               window=window, sinks=sinks)
    torch.testing.assert_close(got.float(), want, **_tol(dtype))
    without = paged_attention_ref(q, kb, vb, rt, rows, [s - 1 for s in seq_lens], [1] * 4, D ** -0.5, window=window)
    assert not torch.allclose(without, want, **_tol(dtype))  # the sinks change the output
    rows_got = cpu_ops.pool_rows_attention(q, kb, vb, rt, torch.tensor(rows), lens, torch.arange(4),
                                           torch.ones(4, dtype=torch.int64), D ** -0.5, window=window, sinks=sinks)
    torch.testing.assert_close(rows_got.float(), want, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("H,hkv,D", SHAPES)
@pytest.mark.parametrize("window", [0, 7])
def test_extend_with_sinks_matches_reference(isa, dtype, H, hkv, D, window):
    g = torch.Generator().manual_seed(5)
    prefix_lens, extend_lens, rows = [0, 33, 1, 60], [5, 1, 40, 17], [3, 0, 2, 1]
    kb, vb, rt = _pool(g, hkv, D, dtype, rows, [p + n for p, n in zip(prefix_lens, extend_lens)])
    T = sum(extend_lens)
    q = torch.randn(T, H, D, generator=g).to(dtype)
    k = torch.empty(T, hkv, D, dtype=dtype)
    v = torch.empty(T, hkv, D, dtype=dtype)
    start = 0
    for row, p, n in zip(rows, prefix_lens, extend_lens):  # the new tokens' K/V, in the pool as the model stores
        k[start:start + n] = kb[:, rt[row, p:p + n]].transpose(0, 1)
        v[start:start + n] = vb[:, rt[row, p:p + n]].transpose(0, 1)
        start += n
    sinks = _sinks(g, H)
    starts = torch.tensor([sum(extend_lens[:i]) for i in range(4)])
    prefix = cpu_ops.PagedPrefix(kb, vb, rt, torch.tensor(rows), torch.tensor(prefix_lens))
    got = cpu_ops.extend_causal(q, k, v, starts, torch.tensor(extend_lens), D ** -0.5, prefix, window=window,
                                sinks=sinks)
    want = paged_attention_ref(q, kb, vb, rt, rows, prefix_lens, extend_lens, D ** -0.5, window=window, sinks=sinks)
    torch.testing.assert_close(got.view(T, H, D).float(), want, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_sink_merged_into_a_cascade_prior(isa, dtype):
    """Rows whose shared prefix ran as cascade attention (the prior) and rows without one (an empty prior):
    the sink joins both, and the result is attention over prefix + own keys + sink."""
    g = torch.Generator().manual_seed(6)
    H, hkv, D = 8, 2, 64
    shared, own, rows = 24, [3, 9], [0, 1]
    kb, vb, rt = _pool(g, hkv, D, dtype, rows, [shared + n for n in own])
    rt[1, :shared] = rt[0, :shared]  # both requests share their first 24 positions
    B = 2
    q = torch.randn(B, H, D, generator=g).to(dtype)
    sinks = _sinks(g, H)
    lens = torch.tensor([shared + n for n in own])
    o, lse = prefix_attention_ref(q, kb, vb, rt, [0], [shared], [0, 1], [0, 2], D ** -0.5)
    prior = (o.to(dtype), lse)
    got = cpu_ops.paged_decode(q, kb, vb, rt, torch.tensor(rows), lens, D ** -0.5,
                               torch.full((B,), shared, dtype=torch.int64), prior, sinks=sinks)
    want = paged_attention_ref(q, kb, vb, rt, rows, [n - 1 for n in lens.tolist()], [1] * B, D ** -0.5, sinks=sinks)
    torch.testing.assert_close(got.float(), want, **_tol(dtype))
    # an empty prior (rows no group covers) takes the sink alone
    empty = cpu_ops.empty_prior(B, H, D, dtype)
    got = cpu_ops.paged_decode(q, kb, vb, rt, torch.tensor(rows), lens, D ** -0.5, None, empty, sinks=sinks)
    torch.testing.assert_close(got.float(), want, **_tol(dtype))
