"""Tensor parallelism for the hybrid families (Qwen3-Next with its MoE, Qwen3.5 text): two gloo ranks, each with
one of the tiny checkpoint's two linear-attention key heads (and its value heads, conv channels and state) and
half of the attention heads; float32 greedy token for token against transformers, prefill chunks shorter than
the prompt, a second request continuing from a state snapshot (cached tokens > 0), the pools whole after; a
constrained request's jump-forward drafts verified with every rank's state rolled back alike (mem/verify_states.py
VerifyKeep) give the tokens it gets with jump-forward off.
The split itself: every channel and head of a layer on exactly one rank."""

from __future__ import annotations

import pytest

from tiny_checkpoints import HYBRID_CASES, HYBRID_TINY, build_tiny, hf_greedy

NEW = 6
LONG = list(range(300, 400))  # 100 tokens: four prefill chunks of 32
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
REGEX_SP = {"max_new_tokens": 40, "temperature": 0, "regex": r'\{"name": "[a-z]{1,6}", "ok": (true|false)\}'}


@pytest.mark.parametrize("name", sorted(HYBRID_CASES))
def test_tp2_matches_transformers_with_a_state_hit(name, tmp_path):
    from radixlang_runtime import Engine

    cls_name, kwargs = HYBRID_CASES[name]
    model = build_tiny(tmp_path, cls_name, HYBRID_TINY, kwargs)
    prompts = [LONG, [5, 77, 1200, 9, 4000, 31]]
    want = [hf_greedy(model, p, NEW) for p in prompts]
    with Engine(str(tmp_path), dtype="float32", tp_size=2, max_total_tokens=1024, page_size=4,
                chunked_prefill_size=32, debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=prompts, sampling_params=SP)
        extended = LONG + want[0] + [11, 12, 13]
        again = eng.generate(input_ids=extended, sampling_params=SP)
        constrained = [eng.generate(input_ids=[5, 77, 1200], sampling_params=REGEX_SP)]
        eng._loop.call(lambda s: setattr(s.grammar, "jump_forward", False))
        constrained.append(eng.generate(input_ids=[5, 77, 1200], sampling_params=REGEX_SP))
        eng.check_integrity()
        stats = eng.get_stats()
        pool = eng.scheduler.runner.state_pool
    assert [o["output_ids"] for o in outs] == want
    assert again["output_ids"] == hf_greedy(model, extended, NEW)
    assert again["meta_info"]["cached_tokens"] > 0
    assert stats["state_pool"]["snapshot_hits"] >= 1 and stats["state_pool"]["request_slots_in_use"] == 0
    assert pool.ssm.shape[2] == HYBRID_TINY["linear_num_value_heads"] // 2  # rank 0 holds half of the state
    jumped, plain = constrained
    assert jumped["output_ids"] == plain["output_ids"]
    assert jumped["meta_info"]["forced_tokens"] > 0 and plain["meta_info"]["forced_tokens"] == 0


def test_each_rank_holds_its_heads_channels():
    from radixlang_runtime.model.layers.linear_attn_spec import LinearAttnSpec

    spec = LinearAttnSpec((True,), num_k_heads=4, num_v_heads=8, k_head_dim=3, v_head_dim=2, conv_kernel=4)
    owned = sorted(c for r in range(4) for part in spec.rank_channels(4, r) for c in part)
    assert owned == list(range(spec.conv_dim))
    assert spec.split(2).conv_dim * 2 == spec.conv_dim and spec.split(2).state_shapes()[0] == (4, 3, 2)
    with pytest.raises(ValueError, match="tp_size 3 cannot split 4 linear-attention key heads"):
        spec.split(3)
