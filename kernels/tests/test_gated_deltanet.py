"""The Gated DeltaNet kernels (csrc/cpu/gated_deltanet.c: decode, the per-token prefill) against
radixlang_kernels/reference.py's torch form, once per instruction set this machine has (the `isa` fixture):
grouped key heads, head dims past and under one vector and odd ones, shuffled state slots updated in place (the
others untouched), bf16 and float32 windows; ragged prefill segments, one empty."""

from __future__ import annotations

import pytest
import torch

from radixlang_kernels import gdn_ops
from radixlang_kernels.cpu_caps import detect
from radixlang_kernels.reference import gdn_decode_ref
from radixlang_kernels.testing import isas, use_isa_library

pytestmark = pytest.mark.skipif(detect().compiler is None, reason="no C compiler: torch fallback in use")


@pytest.fixture(params=isas())
def isa(request, monkeypatch):
    return use_isa_library(request.param, monkeypatch)


def _case(seed, B, Hk, Hv, Dk, Dv, K, N, dtype):
    g = torch.Generator().manual_seed(seed)
    C = 2 * Hk * Dk + Hv * Dv
    x = torch.randn(B, C + 5, generator=g).to(dtype)[:, 3:C + 3]  # strided rows, as the projection's split gives
    conv = torch.randn(N, C, K - 1, generator=g).to(dtype)
    w = (0.5 * torch.randn(C, K, generator=g)).to(dtype)
    gate = -torch.rand(B, Hv, generator=g) * 2
    beta = torch.rand(B, Hv, generator=g)
    state = torch.randn(N, Hv, Dk, Dv, generator=g)
    slots = torch.randperm(N, generator=g)[:B]
    return x, conv, w, gate, beta, state, slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,Hk,Hv,Dk,Dv,K", [(3, 2, 4, 16, 8, 4), (2, 1, 3, 128, 128, 4), (5, 3, 3, 13, 37, 3),
                                             (1, 2, 8, 64, 80, 4)])
def test_decode_step_matches_reference(isa, dtype, B, Hk, Hv, Dk, Dv, K):
    x, conv, w, gate, beta, state, slots = _case(0, B, Hk, Hv, Dk, Dv, K, 9, dtype)
    conv_ref, state_ref = conv.clone(), state.clone()
    want = gdn_decode_ref(x, conv_ref, w, gate, beta, state_ref, slots, Hk)
    mixed = gdn_ops.gdn_conv_update(x, conv, w, slots)
    assert torch.equal(conv, conv_ref)  # the window shifted exactly; untouched slots too
    got = gdn_ops.gdn_decode(mixed, gate, beta, state, slots, Hk, Dk)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, state_ref, rtol=1e-5, atol=1e-5)
    others = torch.ones(9, dtype=torch.bool)
    others[slots] = False
    assert torch.equal(state[others], state_ref[others])


def test_decode_many_steps_stay_with_the_reference(isa):
    """Twenty steps of a batch carried in the pool: the state's rounding does not drift from the reference's."""
    x, conv, w, gate, beta, state, slots = _case(1, 4, 2, 4, 32, 32, 4, 6, torch.float32)
    conv_ref, state_ref = conv.clone(), state.clone()
    g = torch.Generator().manual_seed(2)
    for _ in range(20):
        x = torch.randn(x.shape, generator=g)
        want = gdn_decode_ref(x, conv_ref, w, gate, beta, state_ref, slots, 2)
        got = gdn_ops.gdn_decode(gdn_ops.gdn_conv_update(x, conv, w, slots), gate, beta, state, slots, 2, 32)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, state_ref, rtol=1e-5, atol=1e-5)


def test_a_slot_outside_the_pool_is_refused(isa):
    x, conv, w, gate, beta, state, slots = _case(3, 2, 1, 2, 16, 16, 4, 4, torch.float32)
    bad = torch.tensor([0, 4])
    with pytest.raises(RuntimeError, match="gdn_conv_update_f32"):
        gdn_ops.gdn_conv_update(x, conv, w, bad)
    with pytest.raises(RuntimeError, match="gdn_decode_f32"):
        gdn_ops.gdn_decode(x.float().contiguous(), gate, beta, state, bad, 1, 16)


@pytest.mark.parametrize("Hk,Hv,Dk,Dv", [(2, 4, 16, 8), (1, 2, 64, 80), (3, 3, 13, 37)])
def test_prefill_segments_match_the_rule_token_after_token(isa, Hk, Hv, Dk, Dv):
    """Ragged segments (one empty, one of a single row) from shuffled slots: each row's output and each segment's
    final state as the reference's step applied token after token."""
    from radixlang_kernels.reference import gdn_rule_ref

    g = torch.Generator().manual_seed(4)
    lens, N = [5, 1, 0, 70], 7
    T, C = sum(lens), 2 * Hk * Dk + Hv * Dv
    mixed = torch.randn(T, C + 3, generator=g)[:, :C]  # strided rows
    gate, beta = -torch.rand(T, Hv, generator=g) * 2, torch.rand(T, Hv, generator=g)
    state = torch.randn(N, Hv, Dk, Dv, generator=g)
    slots = torch.randperm(N, generator=g)[:len(lens)]
    starts = torch.tensor([sum(lens[:i]) for i in range(len(lens))])
    want_state = state.clone()
    want = torch.empty(T, Hv, Dv)
    for r, n in enumerate(lens):
        s = want_state[slots[r]].unsqueeze(0)
        for i in range(starts[r], starts[r] + n):
            o, s = gdn_rule_ref(mixed[i:i + 1], gate[i:i + 1], beta[i:i + 1], s, Hk)
            want[i] = o[0]
        want_state[slots[r]] = s[0]
    got = gdn_ops.gdn_prefill(mixed, gate, beta, state, slots, starts, torch.tensor(lens), Hk, Dk)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, want_state, rtol=1e-5, atol=1e-5)
