"""--enable-deterministic-inference on a hybrid model (tiny Qwen3.5 text, float32): mixed greedy requests give
the same tokens and the same logprobs to the bit run one at a time (later ones continuing from state snapshots),
all in one batch, and on a pool tight enough to retract (the re-prefill recomputes the Gated DeltaNet state;
without the mode the logprobs differ in the last bits); a constrained request's sampled tokens get the same
logprobs to the bit with jump-forward on (its drafts verified position by position) and off; Qwen3-Next stays
refused (its
expert GEMMs). The C pieces the mode runs the DeltaNet on agree with the torch path, and prefill's convolution
gives decode's bits."""

from __future__ import annotations

import pytest
import torch

from radixlang_kernels.cpu_caps import detect
from tiny_checkpoints import HYBRID_CASES, HYBRID_TINY, build_tiny

pytestmark = pytest.mark.skipif(detect().compiler is None, reason="the mode needs the C kernels")

BASE = list(range(300, 340))
REQS = [(BASE + [7 * i + 1000 for i in range(k)], 10 + 2 * k) for k in range(6)]  # shared prefix, 40 .. 45 tokens
REQS += [([5, 77, 1200, 9, 4000, 31], 12), (list(range(600, 661)), 8), ([42], 9)]
REGEX_SP = {"temperature": 0, "max_new_tokens": 40, "regex": r'\{"name": "[a-z]{1,6}", "ok": (true|false)\}'}


def _run(eng, one_at_a_time: bool) -> list[list[tuple[float, int]]]:
    """Each request's (logprob, token id) per output token: the logprobs compared bit for bit (float32 greedy
    tokens of a tiny model rarely flip on a last-bit difference; their logprobs do)."""
    sps = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for _, n in REQS]
    ids = [p for p, _ in REQS]
    starts = [len(p) - 1 for p in ids]  # the prompt's last position only: the prefix stays servable from the cache
    if one_at_a_time:
        outs = [eng.generate(input_ids=p, sampling_params=sp, return_logprob=True, logprob_start_len=n)
                for p, sp, n in zip(ids, sps, starts)]
    else:
        outs = eng.generate(input_ids=ids, sampling_params=sps, return_logprob=True, logprob_start_len=starts)
    return [[tuple(x[:2]) for x in o["meta_info"]["output_token_logprobs"]] for o in outs]


def test_same_tokens_alone_batched_and_retracted(tmp_path):
    from radixlang_runtime import Engine

    cls_name, kwargs = HYBRID_CASES["qwen3_5"]
    build_tiny(tmp_path, cls_name, HYBRID_TINY, kwargs)
    det = dict(dtype="float32", enable_deterministic_inference=True, page_size=4, chunked_prefill_size=32,
               debug_check_integrity=True)
    with Engine(str(tmp_path), max_total_tokens=2048, **det) as eng:
        layers = eng.scheduler.runner.model.layers
        assert all(layer.mixer.deterministic for layer in layers)
        alone = _run(eng, one_at_a_time=True)
        hits = eng.get_stats()["state_pool"]["snapshot_hits"]
        eng.flush_cache()
        batched = _run(eng, one_at_a_time=False)
        jumped = eng.generate(input_ids=[5, 77, 1200], sampling_params=REGEX_SP, return_logprob=True)
        eng._loop.call(lambda s: setattr(s.grammar, "jump_forward", False))
        plain = eng.generate(input_ids=[5, 77, 1200], sampling_params=REGEX_SP, return_logprob=True)
        eng.check_integrity()
    assert hits >= 1  # the one-at-a-time run continued from snapshots of the shared prefix
    with Engine(str(tmp_path), max_total_tokens=192, new_token_ratio_init=0.05, new_token_ratio_min=0.05,
                **det) as eng:
        tight = _run(eng, one_at_a_time=False)
        assert eng.scheduler.num_retracted_total > 0, "the pool was meant to force retractions"
        eng.check_integrity()
        assert eng.get_stats()["state_pool"]["request_slots_in_use"] == 0
    assert [len(o) for o in alone] == [n for _, n in REQS]
    assert batched == alone
    assert tight == alone
    assert jumped["output_ids"] == plain["output_ids"] and jumped["meta_info"]["forced_tokens"] > 0
    sampled = [(a, b) for a, b in zip(jumped["meta_info"]["output_token_logprobs"],
                                      plain["meta_info"]["output_token_logprobs"]) if a[0] is not None]
    assert sampled and all(a[:2] == b[:2] for a, b in sampled)


def test_qwen3_next_is_refused_for_its_experts(tmp_path):
    from radixlang_runtime import Engine

    cls_name, kwargs = HYBRID_CASES["qwen3_next"]
    build_tiny(tmp_path, cls_name, HYBRID_TINY, kwargs)
    with pytest.raises(ValueError, match="expert GEMMs"):
        Engine(str(tmp_path), dtype="float32", max_total_tokens=256, enable_deterministic_inference=True)


def test_the_c_pieces_agree_with_torch_and_prefill_gives_decode_bits():
    import torch.nn.functional as F

    from radixlang_kernels import cpu_ops, gdn_ops

    if cpu_ops.load() is None:
        pytest.skip("no kernel library")
    torch.manual_seed(0)
    a, b, A_log, dt_bias = torch.randn(7, 4) * 5, torch.randn(7, 4), torch.randn(4), torch.randn(4)
    g, beta = gdn_ops.gdn_gates(a, b, A_log, dt_bias)
    torch.testing.assert_close(g, -A_log.exp() * F.softplus(a + dt_bias), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(beta, b.sigmoid(), rtol=1e-6, atol=1e-6)
    x, z, w = torch.randn(5, 8), torch.randn(5, 8), torch.randn(8)
    want = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)) * F.silu(z)
    torch.testing.assert_close(gdn_ops.gdn_gated_norm(x, z, w, 1e-6), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gdn_ops.sigmoid_mul(x, z), x * z.sigmoid(), rtol=1e-6, atol=1e-6)
    for dtype in (torch.float32, torch.bfloat16):
        x, w = torch.randn(11, 24).to(dtype), torch.randn(24, 4).to(dtype)
        conv = torch.randn(3, 24, 3).to(dtype)
        c1, c2, slot = conv.clone(), conv.clone(), torch.tensor([2])
        whole = gdn_ops.gdn_conv_prefill(x, c1, w, slot, torch.tensor([0]), torch.tensor([11]))
        steps = torch.cat([gdn_ops.gdn_conv_update(x[i:i + 1], c2, w, slot) for i in range(11)])
        assert torch.equal(whole, steps) and torch.equal(c1, c2)
