"""The Triton Gated DeltaNet kernels (radixlang_kernels/gated_deltanet.py) against reference.py's torch ops
(interpreted on CPU: TRITON_INTERPRET=1 where there is no GPU): a decode step of a batch on scattered slots, and
segments of several tokens (one of them from a fresh state, one from a carried one) equal to the same tokens
decoded one by one."""

from __future__ import annotations

import pytest
import torch

from radixlang_kernels.testing import interpret_triton_without_gpu  # noqa: E402

interpret_triton_without_gpu()  # before triton's import
triton = pytest.importorskip("triton")

from radixlang_kernels.gated_deltanet import gdn_conv, gdn_rule  # noqa: E402
from radixlang_kernels.reference import gdn_decode_ref  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HK, HV, DK, DV, K, N = 2, 4, 8, 6, 4, 5  # Dv not a power of two: masked lanes
C = 2 * HK * DK + HV * DV


def _inputs(T: int, dtype: torch.dtype, g: torch.Generator):
    x = torch.randn(T, C, generator=g).to(dtype)
    w = (0.5 * torch.randn(C, K, generator=g)).to(dtype)
    gate = -torch.rand(T, HV, generator=g)
    beta = torch.rand(T, HV, generator=g)
    conv = torch.randn(N, C, K - 1, generator=g).to(dtype)
    state = torch.randn(N, HV, DK, DV, generator=g)
    return x, w, gate, beta, conv, state


def _run(x, w, gate, beta, conv, state, slots, starts, lens):
    dev = [t.to(DEVICE) for t in (x, w, gate, beta, conv, state, slots, starts, lens)]
    mixed = gdn_conv(dev[0], dev[4], dev[1], dev[6], dev[7], dev[8])
    o = gdn_rule(mixed, dev[2], dev[3], dev[5], dev[6], dev[7], dev[8], HK)
    return o.cpu(), dev[4].cpu(), dev[5].cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_step_matches_the_reference(dtype):
    g = torch.Generator().manual_seed(0)
    x, w, gate, beta, conv, state = _inputs(3, dtype, g)
    slots = torch.tensor([4, 0, 2])
    want_conv, want_state = conv.clone(), state.clone()
    want = gdn_decode_ref(x, want_conv, w, gate, beta, want_state, slots, HK)
    o, got_conv, got_state = _run(x, w, gate, beta, conv.clone(), state.clone(), slots, torch.arange(3),
                                  torch.ones(3, dtype=torch.int64))
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(o, want, **tol)
    torch.testing.assert_close(got_state, want_state, **tol)
    assert torch.equal(got_conv, want_conv)  # the windows: copies of inputs
    assert torch.equal(got_state[[1, 3]], state[[1, 3]])  # slots of no row are left alone


def test_segments_equal_their_tokens_decoded_one_by_one():
    g = torch.Generator().manual_seed(1)
    lens = torch.tensor([5, 1, 2])  # a segment shorter than the window (2 < K - 1): old entries carried over
    x, w, gate, beta, conv, state = _inputs(int(lens.sum()), torch.float32, g)
    slots, starts = torch.tensor([3, 1, 0]), torch.tensor([0, 5, 6])
    conv[3], state[3] = 0, 0  # a fresh request
    want_conv, want_state = conv.clone(), state.clone()
    want = []
    for r in range(3):
        for t in range(int(starts[r]), int(starts[r] + lens[r])):
            want.append(gdn_decode_ref(x[t:t + 1], want_conv, w, gate[t:t + 1], beta[t:t + 1], want_state,
                                       slots[r:r + 1], HK))
    o, got_conv, got_state = _run(x, w, gate, beta, conv.clone(), state.clone(), slots, starts, lens)
    torch.testing.assert_close(o, torch.cat(want), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_state, want_state, rtol=1e-4, atol=1e-4)
    assert torch.equal(got_conv, want_conv)
