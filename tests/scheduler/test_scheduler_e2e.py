"""The scheduler on the real model: memory pressure (retraction), chunked prefill, abort mid-chunk, a chunked prompt
yielding its prefill to one of higher priority."""

from __future__ import annotations

import random
import threading
import time

import pytest

from conftest import assert_whole, running_engine, wait_idle

GREEDY = {"temperature": 0, "ignore_eos": True}


def pressure_workload() -> tuple[list[list[int]], list[dict]]:
    rng = random.Random(7)
    ids, sps = [], []
    for _ in range(12):  # ~900 tokens of demand on a 256-token pool
        ids.append([rng.randrange(100, 49000) for _ in range(rng.randrange(20, 101))])
        sps.append({**GREEDY, "max_new_tokens": rng.randrange(8, 25)})
    return ids, sps


@pytest.fixture(scope="module")
def roomy_outputs(engine_fp32):
    ids, sps = pressure_workload()
    return [o["output_ids"] for o in engine_fp32.generate(input_ids=ids, sampling_params=sps)]


@pytest.mark.parametrize("page_size", [1, 16])
def test_memory_pressure_retracts_and_loses_nothing(page_size, roomy_outputs):
    from radixlang_runtime import Engine

    ids, sps = pressure_workload()
    # An optimistic decode reservation (new_token_ratio 0.05) admits more than fits: decode must retract.
    with Engine(dtype="float32", max_total_tokens=256, page_size=page_size, new_token_ratio_init=0.05,
                new_token_ratio_min=0.05, debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=ids, sampling_params=sps)
        stats = eng.get_stats()
        assert stats["num_retractions"] > 0
        assert sum(o["meta_info"]["num_retractions"] for o in outs) == stats["num_retractions"]
        for i, (o, want) in enumerate(zip(outs, roomy_outputs)):
            assert o["output_ids"] == want, f"request {i} differs from the roomy pool"
        assert_whole(eng)


@pytest.fixture(scope="module")
def engine_chunked():
    yield from running_engine(dtype="float32", max_total_tokens=8192, chunked_prefill_size=128,
                              debug_check_integrity=True)


def long_prompt(n: int = 1500, seed: int = 3) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 49000) for _ in range(n)]


def test_chunked_prefill_matches_unchunked_and_decode_keeps_going(engine_chunked, engine_fp32):
    eng = engine_chunked
    assert eng.flush_cache() and engine_fp32.flush_cache()
    prompt = long_prompt()
    want = engine_fp32.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 8})
    ref_steps = engine_fp32._loop.call(lambda s: list(s.recent_batches))
    assert ("extend", 1, 1500) in ref_steps[-8:]  # the reference prefilled in one pass

    # The streamer decodes until it is aborted, not for a fixed count: how far it got before the long
    # prompt arrived depends on thread scheduling, so a fixed length could end it before the chunks.
    streamer_tokens: list[int] = []
    streamer_meta: dict = {}
    started = threading.Event()

    def stream() -> None:
        for chunk in eng.generate(input_ids=[100, 200, 300, 400], rid="streamer", stream=True,
                                  sampling_params={**GREEDY, "max_new_tokens": 4000}):
            streamer_tokens[:] = chunk["output_ids"]
            streamer_meta.update(chunk["meta_info"])
            started.set()

    th = threading.Thread(target=stream)
    th.start()
    assert started.wait(30)
    got = eng.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 8})
    assert th.is_alive() and streamer_meta["finish_reason"] is None  # still decoding after the prompt's 8 tokens
    phases = eng._loop.call(lambda s: [(p, t) for p, _, t in s.recent_batches])
    eng.abort("streamer")
    th.join(30)
    assert not th.is_alive()
    assert got["output_ids"] == want["output_ids"]
    assert streamer_meta["finish_reason"]["type"] == "abort"
    assert len(streamer_tokens) == streamer_meta["completion_tokens"] >= 8

    chunks = [i for i, (p, t) in enumerate(phases) if p == "extend" and t == 128]
    assert len(chunks) >= 11  # 1500 tokens / 128 (the last chunk is shorter)
    interleaved = sum("decode" in [p for p, _ in phases[a + 1 : b]] for a, b in zip(chunks, chunks[1:]))
    assert interleaved >= 8  # the stream stepped between chunks while it was still decoding
    assert_whole(eng)


def test_abort_mid_chunk_frees_everything(engine_chunked):
    eng = engine_chunked
    rid = "long-abort"
    th = threading.Thread(target=lambda: eng.generate(input_ids=long_prompt(2500, seed=4), rid=rid,
                                                      sampling_params={**GREEDY, "max_new_tokens": 4}))
    th.start()
    deadline = time.time() + 30
    while eng._loop.call(lambda s: s.chunked_req is None) and time.time() < deadline:
        time.sleep(0.005)
    assert eng._loop.call(lambda s: s.chunked_req is not None and s.chunked_req.rid == rid)
    eng.abort(rid)
    th.join(30)
    wait_idle(eng)
    assert_whole(eng)


def test_chunked_prefill_returns_every_input_logprob(engine_chunked, engine_fp32):
    prompt = long_prompt(700, seed=5)
    kw = dict(sampling_params={**GREEDY, "max_new_tokens": 2}, return_logprob=True, logprob_start_len=0)
    chunked = engine_chunked.generate(input_ids=prompt, **kw)["meta_info"]["input_token_logprobs"]
    whole = engine_fp32.generate(input_ids=prompt, **kw)["meta_info"]["input_token_logprobs"]
    assert len(chunked) == len(whole) == 700 and chunked[0][0] is None
    assert [t for _, t, _ in chunked] == prompt
    assert max(abs(a[0] - b[0]) for a, b in zip(chunked[1:], whole[1:])) < 2e-4


def test_a_higher_priority_prompt_takes_the_next_chunk_and_both_keep_their_tokens():
    """--enable-priority-scheduling: a prompt of higher priority that arrives while a long one is being chunked runs
    its prefill next; the long one resumes from its cached chunks (none computed twice) and both have the tokens
    they have alone."""
    from radixlang_runtime import Engine

    low_ids, high_ids = long_prompt(400, seed=6), long_prompt(100, seed=7)
    sp = {**GREEDY, "max_new_tokens": 6}
    with Engine(dtype="float32", max_total_tokens=2048, chunked_prefill_size=32, enable_priority_scheduling=True,
                debug_check_integrity=True) as eng:
        alone = [eng.generate(input_ids=ids, sampling_params=sp)["output_ids"] for ids in (low_ids, high_ids)]
        assert eng.flush_cache()
        computed = eng.get_stats()["prefill_tokens_computed"]
        out: dict = {}
        th = threading.Thread(target=lambda: out.update(
            low=eng.generate(input_ids=low_ids, rid="low", priority=0, sampling_params=sp)))
        th.start()
        deadline = time.time() + 60
        while not eng._loop.call(lambda s: s.chunked_req is not None and s.chunked_req.rid == "low"):
            assert time.time() < deadline, "the long prompt never started its chunks"
            time.sleep(0.005)
        high = eng.generate(input_ids=high_ids, rid="high", priority=1, sampling_params=sp)
        th.join(120)
        assert not th.is_alive()
        stats = eng.get_stats()
        assert stats["num_priority_preemptions"] == 1 and out["low"]["meta_info"]["num_retractions"] == 1
        assert [out["low"]["output_ids"], high["output_ids"]] == alone
        assert stats["prefill_tokens_computed"] - computed == 400 + 100
        assert_whole(eng)
