"""The LoRA segment kernels (lora_sgmv.c: shrink and expand over row segments with per-segment adapters) against
torch math, once per instruction set this machine has (the `isa` fixture: AVX-512, AVX2, plain C under
RADIXLANG_CPU_MASK). Skipped where no compiler exists."""

from __future__ import annotations

import pytest
import torch

from radixlang_kernels import cpu_ops
from radixlang_kernels.cpu_caps import detect
from radixlang_kernels.op_table import pointer_array
from radixlang_kernels.testing import isas, use_isa_library

pytestmark = pytest.mark.skipif(detect().compiler is None, reason="no C compiler: torch fallback in use")


@pytest.fixture(params=isas())
def isa(request, monkeypatch):
    return use_isa_library(request.param, monkeypatch)


def _segments(g, T, groups):
    """groups: rows per segment, drawn without repeats from T rows (gathered, interleaved)."""
    perm = torch.randperm(T, generator=g)[: sum(groups)]
    starts = [0]
    for n in groups:
        starts.append(starts[-1] + n)
    return perm.to(torch.int64), torch.tensor(starts, dtype=torch.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("K, ranks, groups", [
    (576, [16, 8], [3, 5]),  # K a multiple of 16 and 32
    (37, [3, 1, 5], [1, 4, 2]),  # K with a tail, odd ranks
    (1536, [48], [20]),  # stacked q/k/v ranks, a long segment (threaded)
])
def test_shrink_and_expand_match_torch(isa, dtype, K, ranks, groups):
    """float32 math on the same (bf16-rounded) inputs; bf16 outputs rounded once."""
    g = torch.Generator().manual_seed(len(groups) * K)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-2, atol=2e-2)
    T = sum(groups) + 3  # rows no segment names are left alone
    x = torch.randn(T, K + 5, generator=g).to(dtype)[:, :K]  # a row stride wider than K, as a view passes it
    rows, starts = _segments(g, T, groups)
    a = [torch.randn(r, K, generator=g).to(dtype) for r in ranks]
    width = max(ranks) + 2
    t = torch.full((len(rows), width), float("nan"))
    cpu_ops.lora_shrink(x, rows, starts, pointer_array([m.data_ptr() for m in a]),
                        torch.tensor(ranks, dtype=torch.int64), t)
    for s, r in enumerate(ranks):
        lo, hi = starts[s].item(), starts[s + 1].item()
        torch.testing.assert_close(t[lo:hi, :r], x[rows[lo:hi]].float() @ a[s].float().t(), rtol=1e-4, atol=1e-3)

    # expand: two tasks per segment (two output slices, each from its own columns of t), N with a tail
    N = 70
    tasks, bts = [], []
    for s, r in enumerate(ranks):
        half = max(r // 2, 1)
        tasks += [[s, 0, half, 0, 33], [s, r - half, half, 33, N - 33]]
        bts += [torch.randn(half, 33, generator=g).to(dtype), torch.randn(half, N - 33, generator=g).to(dtype)]
    t = torch.randn(len(rows), width, generator=g)
    y = torch.randn(T, N, generator=g).to(dtype)
    want = y.float()
    for (s, col, r, off, n), bt in zip(tasks, bts):
        lo, hi = starts[s].item(), starts[s + 1].item()
        want[rows[lo:hi], off:off + n] += t[lo:hi, col:col + r] @ bt.float()
    cpu_ops.lora_expand(t, rows, starts, torch.tensor(tasks, dtype=torch.int64),
                        pointer_array([b.data_ptr() for b in bts]), y)
    assert y.dtype == dtype
    torch.testing.assert_close(y.float(), want, **tol)


def test_rank_beyond_the_limit_is_refused(isa):
    x, t = torch.zeros(1, 4), torch.zeros(1, 2)
    a = torch.zeros(3, 4)
    with pytest.raises(RuntimeError, match="lora_shrink_f32"):  # rank 3 does not fit t's width 2
        cpu_ops.lora_shrink(x, torch.zeros(1, dtype=torch.int64), torch.tensor([0, 1]), pointer_array([a.data_ptr()]),
                            torch.tensor([3]), t)
