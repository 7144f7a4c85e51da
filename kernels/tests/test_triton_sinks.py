"""Attention sinks in the Triton extend and decode kernels against kernels/reference.py (interpreted on CPU:
TRITON_INTERPRET=1 where there is no GPU): with and without windows, decode with a cascade prior."""

from __future__ import annotations

import pytest
import torch

from radixlang_kernels.testing import interpret_triton_without_gpu  # noqa: E402

interpret_triton_without_gpu()  # before triton's import
triton = pytest.importorskip("triton")

from radixlang_kernels.decode_attention import decode_attention  # noqa: E402
from radixlang_kernels.extend_attention import extend_attention  # noqa: E402
from radixlang_kernels.reference import paged_attention_ref, prefix_attention_ref  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H, HKV, D = 8, 2, 64


def _setup(prefix, ext, seed):
    """A pool with each request's positions on shuffled slots; the new tokens' K/V stored, as the model does."""
    g = torch.Generator().manual_seed(seed)
    N = sum(p + n for p, n in zip(prefix, ext)) + 8
    kb, vb = torch.randn(HKV, N, D, generator=g), torch.randn(HKV, N, D, generator=g)
    rt = torch.zeros(len(prefix), max(p + n for p, n in zip(prefix, ext)) + 8, dtype=torch.int64)
    free = torch.randperm(N, generator=g).tolist()
    for r, (p, n) in enumerate(zip(prefix, ext)):
        rt[r, :p + n] = torch.tensor([free.pop() for _ in range(p + n)])
    T = sum(ext)
    qkv = torch.randn(T, H + 2 * HKV, D, generator=g)
    q, k, v = qkv[:, :H], qkv[:, H:H + HKV], qkv[:, H + HKV:]
    start = 0
    for r, (p, n) in enumerate(zip(prefix, ext)):
        kb[:, rt[r, p:p + n]] = k[start:start + n].transpose(0, 1)
        vb[:, rt[r, p:p + n]] = v[start:start + n].transpose(0, 1)
        start += n
    return q, k, v, kb, vb, rt, torch.randn(H, generator=g) * 3


def _t(x):
    return torch.tensor(x, dtype=torch.int64, device=DEVICE)


def _d(*xs):
    return [x.to(DEVICE) for x in xs]


@pytest.mark.parametrize("window", [0, 7])
def test_sinks_in_both_kernels(window):
    prefix, ext = [0, 37, 3], [45, 1, 9]
    q, k, v, kb, vb, rt, sinks = _setup(prefix, ext, seed=window)
    rows = list(range(3))
    starts = [sum(ext[:i]) for i in range(3)]
    got = extend_attention(*_d(q, k, v, kb, vb, rt), _t(rows), _t(prefix), _t(ext), _t(starts), D ** -0.5,
                           block_m=16, block_n=16, window=window, sinks=sinks.to(DEVICE)).cpu()
    want = paged_attention_ref(q, kb, vb, rt, rows, prefix, ext, D ** -0.5, window=window, sinks=sinks)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    assert not torch.allclose(want, paged_attention_ref(q, kb, vb, rt, rows, prefix, ext, D ** -0.5, window=window))
    seq = [p + n for p, n in zip(prefix, ext)]
    qd = torch.randn(3, H, D, generator=torch.Generator().manual_seed(6))
    begin = _t([max(0, n - window) for n in seq]) if window else None
    got = decode_attention(*_d(qd, kb, vb, rt), _t(rows), _t(seq), D ** -0.5, split_len=16, k_begin=begin,
                           sinks=sinks.to(DEVICE)).cpu()
    want = paged_attention_ref(qd, kb, vb, rt, rows, [n - 1 for n in seq], [1] * 3, D ** -0.5, window=window,
                               sinks=sinks)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_decode_sinks_with_a_cascade_prior():
    """The shared prefix as the prior (o, lse), each request's own tail in the kernel, the sink merged last."""
    prefix, ext = [30, 30], [4, 9]
    q, _, _, kb, vb, rt, sinks = _setup(prefix, ext, seed=3)
    rt[1, :24] = rt[0, :24]  # both requests share their first 24 positions
    seq = [p + n for p, n in zip(prefix, ext)]
    qd = torch.randn(2, H, D, generator=torch.Generator().manual_seed(8))
    o, lse = prefix_attention_ref(qd, kb, vb, rt, [0], [24], [0, 1], [0, 2], D ** -0.5)
    got = decode_attention(*_d(qd, kb, vb, rt), _t([0, 1]), _t(seq), D ** -0.5, split_len=16, k_begin=_t([24, 24]),
                           prior_o=o.to(DEVICE), prior_lse=lse.to(DEVICE), sinks=sinks.to(DEVICE)).cpu()
    want = paged_attention_ref(qd, kb, vb, rt, [0, 1], [n - 1 for n in seq], [1, 1], D ** -0.5, sinks=sinks)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
