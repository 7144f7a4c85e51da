"""A hybrid model (tiny Qwen3.5 text, float32) served with --attention-backend triton: the Gated DeltaNet runs the
Triton kernels (radixlang_kernels/gated_deltanet.py; interpreted on CPU: TRITON_INTERPRET=1, set in conftest
when there is no GPU) for decode and for prefill chunks shorter than the prompt; greedy token for token against
transformers, a continuation from a state snapshot included; a constrained request's jump-forward drafts
verified position by position on the same kernels (mem/verify_states.py) give the tokens it gets with
jump-forward off. Sizes are small: interpreted Triton is slow."""

from __future__ import annotations

import pytest

from tiny_checkpoints import HYBRID_CASES, HYBRID_TINY, build_tiny, hf_greedy

triton = pytest.importorskip("triton")

NEW = 4
PROMPT = list(range(300, 322))  # 22 tokens: three prefill chunks of 8
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
REGEX_SP = {"max_new_tokens": 24, "temperature": 0, "regex": r'\{"name": "[a-z]{1,4}"\}'}


def test_triton_backend_matches_transformers_with_a_state_hit(tmp_path):
    from radixlang_runtime import Engine

    cls_name, kwargs = HYBRID_CASES["qwen3_5"]
    model = build_tiny(tmp_path, cls_name, HYBRID_TINY, kwargs)
    prompts = [PROMPT, [5, 77, 1200]]
    with Engine(str(tmp_path), dtype="float32", attention_backend="triton", max_total_tokens=256, page_size=4,
                chunked_prefill_size=8, debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=prompts, sampling_params=SP)
        extended = PROMPT + outs[0]["output_ids"] + [11, 12]
        again = eng.generate(input_ids=extended, sampling_params=SP)
        constrained = [eng.generate(input_ids=[5, 77, 1200], sampling_params=REGEX_SP)]
        eng._loop.call(lambda s: setattr(s.grammar, "jump_forward", False))
        constrained.append(eng.generate(input_ids=[5, 77, 1200], sampling_params=REGEX_SP))
        eng.check_integrity()
        stats = eng.get_stats()
    assert stats["cpu"]["paths"]["linear_attention"] == "decode triton, prefill triton:recurrent"
    assert [o["output_ids"] for o in outs] == [hf_greedy(model, p, NEW) for p in prompts]
    assert again["output_ids"] == hf_greedy(model, extended, NEW)
    assert again["meta_info"]["cached_tokens"] > 0
    assert stats["state_pool"]["request_slots_in_use"] == 0
    jumped, plain = constrained
    assert jumped["output_ids"] == plain["output_ids"]
    assert jumped["meta_info"]["forced_tokens"] > 0 and plain["meta_info"]["forced_tokens"] == 0
