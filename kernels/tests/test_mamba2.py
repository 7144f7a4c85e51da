"""The Mamba2 decode kernels (csrc/cpu/mamba2.c after gated_deltanet.c's convolution with its bias) against
radixlang_kernels/reference.py's torch form (the runtime's torch step), once per instruction set this machine has
(the `isa` fixture): grouped B and C, head rows and state widths past and under one vector and odd ones, shuffled
state slots updated in place (the others untouched), bf16 and float32 inputs, twenty steps carried."""

from __future__ import annotations

import pytest
import torch

from radixlang_kernels import gdn_ops, mamba2_ops
from radixlang_kernels.cpu_caps import detect
from radixlang_kernels.reference import mamba2_decode_ref
from radixlang_kernels.testing import isas, use_isa_library

pytestmark = pytest.mark.skipif(detect().compiler is None, reason="no C compiler: torch fallback in use")


@pytest.fixture(params=isas())
def isa(request, monkeypatch):
    return use_isa_library(request.param, monkeypatch)


def _case(seed, B, H, P, G, Nst, K, N, dtype, bias=True):
    g = torch.Generator().manual_seed(seed)
    C = H * P + 2 * G * Nst
    x = torch.randn(B, C + 5, generator=g).to(dtype)[:, 3:C + 3]  # strided rows, as the projection's split gives
    conv = torch.randn(N, C, K - 1, generator=g).to(dtype)
    w = (0.5 * torch.randn(C, K, generator=g)).to(dtype)
    b = (0.1 * torch.randn(C, generator=g)).to(dtype) if bias else None
    dt = torch.randn(B, H + 2, generator=g).to(dtype)[:, 1:H + 1]  # strided, as the split gives
    dt_bias = torch.rand(H, generator=g).to(dtype)
    A = -torch.exp(torch.rand(H, generator=g) * 2)
    D = torch.randn(H, generator=g)
    state = torch.randn(N, H, P, Nst, generator=g)
    slots = torch.randperm(N, generator=g)[:B]
    return x, conv, w, b, dt, dt_bias, A, D, state, slots


def _c_step(x, conv, w, b, dt, dt_bias, A, D, state, slots, G):
    xbc = gdn_ops.gdn_conv_update(x, conv, w, slots, b)
    return mamba2_ops.mamba2_decode(xbc, dt, dt_bias, A, D, state, slots, G)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,H,P,G,Nst,K,bias", [(3, 4, 8, 1, 16, 4, True), (2, 6, 16, 3, 128, 4, True),
                                                (5, 3, 5, 1, 37, 3, False), (1, 8, 64, 2, 128, 4, True),
                                                (4, 4, 7, 4, 13, 2, True)])
def test_decode_step_matches_reference(isa, dtype, B, H, P, G, Nst, K, bias):
    x, conv, w, b, dt, dt_bias, A, D, state, slots = _case(0, B, H, P, G, Nst, K, 9, dtype, bias)
    conv_ref, state_ref = conv.clone(), state.clone()
    want = mamba2_decode_ref(x, conv_ref, w, b, dt, dt_bias, A, D, state_ref, slots, G)
    got = _c_step(x, conv, w, b, dt, dt_bias, A, D, state, slots, G)
    assert torch.equal(conv, conv_ref)  # the window shifted exactly; untouched slots too
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, state_ref, rtol=1e-5, atol=1e-5)
    others = torch.ones(9, dtype=torch.bool)
    others[slots] = False
    assert torch.equal(state[others], state_ref[others])


def test_the_biased_convolution_matches_torch_bits(isa):
    """bf16: the biased sum and the SiLU rounded once each, as torch's bf16 conv1d and silu (equal bits)."""
    x, conv, w, b, *_, slots = _case(5, 6, 8, 32, 1, 64, 4, 8, torch.bfloat16)
    window = torch.cat([conv[slots], x.unsqueeze(-1)], dim=-1)
    want = torch.nn.functional.silu(torch.nn.functional.conv1d(window, w.unsqueeze(1), b, groups=x.shape[1]))[..., -1]
    assert torch.equal(gdn_ops.gdn_conv_update(x, conv, w, slots, b), want.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_many_steps_stay_with_the_reference(isa, dtype):
    """Twenty steps of a batch carried in the pool: the state's rounding does not drift from the reference's."""
    x, conv, w, b, dt, dt_bias, A, D, state, slots = _case(1, 4, 4, 16, 2, 32, 4, 6, dtype)
    conv_ref, state_ref = conv.clone(), state.clone()
    g = torch.Generator().manual_seed(2)
    for _ in range(20):
        x = torch.randn(x.shape, generator=g).to(dtype)
        dt = torch.randn(dt.shape, generator=g).to(dtype)
        want = mamba2_decode_ref(x, conv_ref, w, b, dt, dt_bias, A, D, state_ref, slots, 2)
        got = _c_step(x, conv, w, b, dt, dt_bias, A, D, state, slots, 2)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(conv, conv_ref)
    torch.testing.assert_close(state, state_ref, rtol=1e-5, atol=1e-5)


def test_a_slot_outside_the_pool_is_refused(isa):
    x, conv, w, b, dt, dt_bias, A, D, state, slots = _case(3, 2, 2, 8, 1, 16, 4, 4, torch.float32)
    bad = torch.tensor([0, 4])
    with pytest.raises(RuntimeError, match="gdn_conv_update_f32"):
        gdn_ops.gdn_conv_update(x, conv, w, bad, b)
    with pytest.raises(RuntimeError, match="mamba2_decode_f32"):
        mamba2_ops.mamba2_decode(x.float().contiguous(), dt, dt_bias, A, D, state, bad, 1)
