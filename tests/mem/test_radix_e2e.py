"""RadixAttention end to end on the real model: reuse, exactness, flush, concurrency, both dtypes."""

from __future__ import annotations

import threading

import pytest

from conftest import assert_whole, running_engine

PARAGRAPH = ("The museum's east wing holds maps drawn by sailors who crossed the northern sea before the age of "
             "steam; each chart records currents, harbours and the names of the captains who trusted them. ")
GREEDY = {"max_new_tokens": 16, "min_new_tokens": 16, "temperature": 0}


def prefix_ids(engine, n: int = 500) -> list[int]:
    ids = engine.tokenizer.encode(PARAGRAPH * 20, add_special_tokens=False)
    assert len(ids) >= n
    return ids[:n]


def with_question(engine, prefix: list[int], question: str) -> list[int]:
    return prefix + engine.tokenizer.encode(f"\nQuestion: {question}\nAnswer:", add_special_tokens=False)


@pytest.fixture(scope="module")
def engine_nocache():
    yield from running_engine(dtype="float32", max_total_tokens=4096, page_size=1, disable_radix_cache=True,
                              debug_check_integrity=True)


def test_second_request_reuses_a_500_token_prefix(engine, engine_nocache, hf_greedy):
    assert engine.flush_cache()
    prefix = prefix_ids(engine)
    a = with_question(engine, prefix, "Who drew the maps?")
    b = with_question(engine, prefix, "What do the charts record?")
    out_a = engine.generate(input_ids=a, sampling_params=GREEDY)
    out_b = engine.generate(input_ids=b, sampling_params=GREEDY)
    assert out_a["meta_info"]["cached_tokens"] == 0
    assert out_b["meta_info"]["cached_tokens"] >= 496  # page size 16: 496 = the aligned part of 500
    ref_b = engine_nocache.generate(input_ids=b, sampling_params=GREEDY)
    assert ref_b["meta_info"]["cached_tokens"] == 0
    assert out_b["output_ids"] == ref_b["output_ids"] == hf_greedy(b, 16)
    assert_whole(engine)
    assert_whole(engine_nocache)
    assert engine_nocache.get_stats()["cached_slots"] == 0

    # A flush empties the tree: the same request computes everything again, with the same tokens.
    assert engine.get_stats()["cached_slots"] > 0
    assert engine.flush_cache()
    st = engine.get_stats()
    assert st["cached_slots"] == 0 and st["free_slots"] == st["total_slots"]
    again = engine.generate(input_ids=b, sampling_params=GREEDY)
    assert again["meta_info"]["cached_tokens"] == 0
    assert again["output_ids"] == out_b["output_ids"]


def test_multi_turn_reuses_the_previous_answer(engine, hf_greedy):
    """Turn 2 sends turn 1's prompt + its answer + a new question: all of it comes from the cache."""
    assert engine.flush_cache()
    turn1 = with_question(engine, prefix_ids(engine, 300), "Who trusted the charts?")
    out1 = engine.generate(input_ids=turn1, sampling_params=GREEDY)
    turn2 = turn1 + out1["output_ids"] + engine.tokenizer.encode("\nWhy?", add_special_tokens=False)
    out2 = engine.generate(input_ids=turn2, sampling_params=GREEDY)
    # Cached: the prompt and all answer tokens but the last (its K/V is never computed), page-aligned.
    assert out2["meta_info"]["cached_tokens"] == (len(turn1) + 15) // 16 * 16
    assert out2["output_ids"] == hf_greedy(turn2, 16)


def test_concurrent_requests_share_one_prefix_computation(engine, hf_greedy):
    assert engine.flush_cache()
    prefix = prefix_ids(engine)
    questions = ["Who drew the maps?", "What sea?", "Which age?", "Name a captain."]  # each checked against HF
    prompts = [with_question(engine, prefix, q) for q in questions]
    before = engine.get_stats()
    results: list = [None] * len(prompts)

    def run(i: int) -> None:
        results[i] = engine.generate(input_ids=prompts[i], sampling_params=GREEDY)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = engine.get_stats()
    computed = after["prefill_tokens_computed"] - before["prefill_tokens_computed"]
    total = sum(len(p) for p in prompts)
    assert computed <= total - 2 * 496  # the prefix was computed at most twice
    assert sum(r["meta_info"]["cached_tokens"] >= 496 for r in results) >= 2
    for p, r in zip(prompts, results):
        assert r["output_ids"] == hf_greedy(p, 16)


def test_bf16_cached_prefix_goes_through_the_paged_extend_kernel(engine_bf16):
    """bf16 (the CPU default): outputs with the prefix read from the cache agree with a full prefill."""
    eng = engine_bf16
    assert eng.flush_cache()
    prefix = prefix_ids(eng)
    prompts = [with_question(eng, prefix, q) for q in ("Who drew the maps?", "What sea?", "Which age?")]
    warm = eng.generate(input_ids=prompts[0], sampling_params=GREEDY)
    cached = eng.generate(input_ids=prompts, sampling_params=GREEDY)
    assert all(r["meta_info"]["cached_tokens"] >= 496 for r in cached)
    fresh = []
    for p in prompts:
        assert eng.flush_cache()
        fresh.append(eng.generate(input_ids=p, sampling_params=GREEDY))
    # Same numerics up to bf16 rounding of differently shaped batches: the first 8 tokens agree.
    assert warm["output_ids"][:8] == fresh[0]["output_ids"][:8]
    for c, f in zip(cached, fresh):
        assert c["output_ids"][:8] == f["output_ids"][:8]
    assert_whole(eng)
