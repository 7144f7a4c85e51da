"""A hybrid model's verify step at the layer (model/layers/gated_deltanet.py, mem/verify_states.py): a request's
last token + its draft run through the Gated DeltaNet in one extend step, beside an ordinary prefill. The state
after each of its positions (the DeltaNet matrix and the convolution window) equals decoding those tokens one
by one, as do its outputs; keeping j draft tokens leaves the slot exactly where decoding j + 1 tokens does; a
save planned after the request's own token (scheduler/state_cache.py) snapshots that state. Float32, the torch
ops and the C kernels."""

from __future__ import annotations

import pytest
import torch

from radixlang_kernels import cpu_ops
from radixlang_runtime.mem.state_pool import StatePool, StateShape
from radixlang_runtime.mem.verify_states import VerifyStates
from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.layers.gated_deltanet import GatedDeltaNet
from radixlang_runtime.model.layers.linear_attn_spec import LinearAttnSpec

SPEC = LinearAttnSpec(linear_layers=(True,), num_k_heads=2, num_v_heads=4, k_head_dim=16, v_head_dim=8,
                      conv_kernel=4)
HIDDEN = 32
PREFILL, VERIFY = (0, 5), [(1, 4), (2, 3)]  # (slot, tokens): an ordinary extend, then two verifying requests
SNAPSHOT = 3  # the pool's slot past the requests'
PATHS = [False] + ([True] if cpu_ops.load() is not None else [])  # the C kernels (gated_deltanet.c)


def layer(cpu_kernel: bool) -> GatedDeltaNet:
    torch.manual_seed(0)
    m = GatedDeltaNet(SPEC, HIDDEN, 1e-6, state_index=0)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3)
    m.use_cpu_kernel = cpu_kernel
    return m.eval()


def pool() -> StatePool:
    """States as a prefix left them (random, non-zero)."""
    torch.manual_seed(1)
    p = StatePool(4, StateShape(1, *SPEC.state_shapes(), torch.float32), torch.device("cpu"))
    p.ssm.normal_()
    p.conv.normal_()
    return p


def batch(phase: str, p: StatePool, slots: list[int], lens: list[int], verify=None, saves=None) -> ForwardBatch:
    t = torch.tensor(slots, dtype=torch.int64)
    none = torch.zeros(0, dtype=torch.int64)
    return ForwardBatch(phase=phase, batch_size=len(slots), input_ids=none, positions=none, out_loc=none,
                        req_rows=t, seq_lens=t, seq_lens_cpu=[], prefix_lens_cpu=[8] * len(slots),
                        extend_lens_cpu=lens, kv_pool=None, state_pool=p, state_slots=t, state_slots_cpu=slots,
                        state_fresh=[False] * len(slots), state_saves=saves or {}, state_verify=verify)


def one_by_one(m: GatedDeltaNet, p: StatePool, slot: int, x: torch.Tensor):
    """Decode x's rows one at a time from slot: (outputs [n, hidden], [(ssm, conv) after each row])."""
    outs, states = [], []
    for row in x:
        outs.append(m(row[None], batch("decode", p, [slot], [1]))[0])
        states.append((p.ssm[0, slot].clone(), p.conv[0, slot].clone()))
    return torch.stack(outs), states


@pytest.mark.parametrize("cpu_kernel", PATHS)
def test_verify_states_equal_decoding_one_by_one_and_keep_rolls_back(cpu_kernel):
    m = layer(cpu_kernel)
    torch.manual_seed(2)
    lens = [PREFILL[1]] + [n for _, n in VERIFY]
    x = torch.randn(sum(lens), HIDDEN)
    starts = [sum(lens[:i]) for i in range(len(lens))]
    ref = pool()
    with torch.no_grad():
        want_prefill = m(x[:PREFILL[1]], batch("extend", ref, [PREFILL[0]], [PREFILL[1]]))
        want = [one_by_one(m, ref, slot, x[s:s + n]) for (slot, n), s in zip(VERIFY, starts[1:])]
        p = pool()
        verify = VerifyStates(p, [(i + 1, slot, n) for i, (slot, n) in enumerate(VERIFY)])
        slots = [PREFILL[0]] + [slot for slot, _ in VERIFY]
        got = m(x, batch("extend", p, slots, lens, verify, saves={1: (1, SNAPSHOT)}))
    close = dict(rtol=1e-6, atol=1e-6)  # in_proj over 12 rows or one: float32 sums in another order
    torch.testing.assert_close(got[:PREFILL[1]], want_prefill, **close)
    torch.testing.assert_close(p.ssm[0, PREFILL[0]], ref.ssm[0, PREFILL[0]], **close)
    for i, ((slot, n), s, (outs, states)) in enumerate(zip(VERIFY, starts[1:], want)):
        torch.testing.assert_close(got[s:s + n], outs, **close)
        for j, (ssm, conv) in enumerate(states):  # the state after each position
            torch.testing.assert_close(verify.ssm[0, verify.first[i + 1] + j], ssm, **close)
            torch.testing.assert_close(verify.conv[0, verify.first[i + 1] + j], conv, **close)
    first_ssm, first_conv = want[0][1][0]  # the save after the first verifying request's own token
    torch.testing.assert_close(p.ssm[0, SNAPSHOT], first_ssm, **close)
    torch.testing.assert_close(p.conv[0, SNAPSHOT], first_conv, **close)
    accepted = {1: 2, 2: 0}  # the first kept its token + 2 draft tokens, the second its token alone
    verify.keep(p, accepted)
    for i, (slot, _) in enumerate(VERIFY):
        ssm, conv = want[i][1][accepted[i + 1]]
        torch.testing.assert_close(p.ssm[0, slot], ssm, **close)
        torch.testing.assert_close(p.conv[0, slot], conv, **close)
    assert not torch.equal(p.ssm[0, VERIFY[0][0]], verify.ssm[0, verify.first[1] + VERIFY[0][1] - 1])
    with pytest.raises(ValueError, match="request 1: 4 draft tokens accepted of 3"):
        verify.keep(p, {1: 4})


def test_drafts_are_cut_to_what_the_verify_scratch_holds(monkeypatch):
    """A hybrid model's drafts (n-gram, or a grammar's forced tokens with their states) are cut to draft_cap:
    the per-position states of one request's verify step stay within SCRATCH_BYTES."""
    from types import SimpleNamespace

    from radixlang_runtime.mem import verify_states
    from radixlang_runtime.speculative.drafts import Drafts

    p = pool()
    monkeypatch.setattr(verify_states, "SCRATCH_BYTES", 4 * p.shape.bytes_per_slot())
    cap = verify_states.draft_cap(p)
    assert cap == 3  # with the request's own position: 4 states
    forced = list(range(10, 20))
    grammar = SimpleNamespace(draft=lambda req: (list(forced), [f"state {i}" for i in range(len(forced) + 1)]))
    drafts = Drafts(None, grammar, lambda req: None)
    drafts.max_draft = cap
    req = SimpleNamespace(grammar=object(), finished=False, draft=[], draft_states=[])
    drafts.propose(req, 1)
    assert req.draft == forced[:cap]
    assert req.draft_states == ["state 0", "state 1", "state 2", "state 3"]  # the last: after the kept draft
    monkeypatch.setattr(verify_states, "SCRATCH_BYTES", p.shape.bytes_per_slot() // 2)
    assert verify_states.draft_cap(p) == 1  # never below one draft token
