"""The overlap schedule on the real model in-process (float32 Engine, the embedded SmolLM2): the same greedy
tokens, token for token, as the shared float32 Engine without it, for one mixed batch (lengths, a stop string, a stop
id, EOS, max_new_tokens 1), and the allocator whole after."""

from __future__ import annotations

import pytest

from conftest import PROMPTS, assert_whole, running_engine


@pytest.fixture(scope="module")
def engine_overlap():
    yield from running_engine(dtype="float32", max_total_tokens=8192, debug_check_integrity=True,
                              enable_overlap_schedule=True)


def mixed_params(stop_text: str, stop_id: int) -> list[dict]:
    greedy = {"temperature": 0}
    return [dict(greedy, max_new_tokens=24, ignore_eos=True), dict(greedy, max_new_tokens=1),
            dict(greedy, max_new_tokens=40, stop=[stop_text]), dict(greedy, max_new_tokens=40),
            dict(greedy, max_new_tokens=30, stop_token_ids=[stop_id]), dict(greedy, max_new_tokens=9)]


def test_same_greedy_tokens_with_and_without_overlap(engine_overlap, engine_fp32):
    assert engine_overlap.scheduler.overlap is not None and engine_fp32.scheduler.overlap is None
    probe = engine_fp32.generate(PROMPTS[2], {"temperature": 0, "max_new_tokens": 40})
    stop_text = engine_fp32.tokenizer.decode(probe["output_ids"][10:12])
    stop_id = engine_fp32.generate(PROMPTS[4], {"temperature": 0, "max_new_tokens": 30})["output_ids"][7]
    prompts = PROMPTS[:6]
    params = mixed_params(stop_text, stop_id)
    want = engine_fp32.generate(prompts, params)
    got = engine_overlap.generate(prompts, params)
    for w, g in zip(want, got):
        assert g["output_ids"] == w["output_ids"]
        assert g["text"] == w["text"]
        assert g["meta_info"]["finish_reason"] == w["meta_info"]["finish_reason"]
    assert want[2]["meta_info"]["finish_reason"]["type"] == "stop" and len(want[2]["output_ids"]) < 40
    assert want[4]["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert len(want[1]["output_ids"]) == 1 and len(want[0]["output_ids"]) == 24
    assert engine_overlap.scheduler.overlap.overlapped_steps > 0
    assert_whole(engine_overlap)
    assert_whole(engine_fp32)
