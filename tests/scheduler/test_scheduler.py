"""The scheduler core with a fake runner: no torch, no model."""

from __future__ import annotations

import random
import sys

import pytest

from fakes import expected_output
from scheduler_utils import assert_whole, drain, make, req
from radixlang_runtime.scheduler.request import Req


@pytest.mark.parametrize("page_size", [1, 16])
def test_requests_joining_mid_decode_get_their_solo_output(page_size):
    sched, runner = make(page_size=page_size)
    reqs = [req(f"r{i}", 5 + 7 * i, 20 + i) for i in range(6)]
    done = []
    for i, r in enumerate(reqs):  # one new request every 3 steps, while earlier ones decode
        sched.add_request(r)
        for _ in range(3):
            done += [x for x in sched.step() if x.finished]
    done += drain(sched)
    assert {r.rid for r in done} == {r.rid for r in reqs}
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, r.sampling.max_new_tokens)
        assert r.finished_reason == {"type": "length", "length": r.sampling.max_new_tokens}
    phases = [p for p, _, _ in runner.batches]
    assert "decode" in phases[: phases.index("extend", 1) + 1]  # a prefill came after decoding began
    assert max(b for p, b, _ in runner.batches if p == "decode") > 1  # decode steps were batched
    assert_whole(sched)


@pytest.mark.parametrize("page_size", [1, 16])
def test_chunked_prefill_respects_budgets(page_size):
    sched, runner = make(page_size=page_size, max_prefill=64, chunk=32)
    long = req("long", 150, 5)
    short = [req(f"s{i}", 10, 5) for i in range(4)]
    sched.add_request(long)
    for r in short:
        sched.add_request(r)
    drain(sched)
    assert all(tokens <= 64 for p, _, tokens in runner.batches if p == "extend")
    assert sum(1 for p, _, _ in runner.batches if p == "extend") >= 150 // 32
    for r in [long, *short]:
        assert r.output_ids == expected_output(r.input_ids, 5)
    assert_whole(sched)


@pytest.mark.parametrize("page_size", [1, 16])
def test_retract_decode_when_memory_runs_out(page_size):
    # 8 requests of 20 + 40 tokens need 480 slots; the pool has 256: decode must retract.
    sched, _ = make(num_slots=256, page_size=page_size, ratio=0.05)
    reqs = [req(f"r{i}", 20, 40) for i in range(8)]
    for r in reqs:
        sched.add_request(r)
    drain(sched)
    assert sched.num_retracted_total > 0
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, 40), r.rid
    assert_whole(sched)


def test_abort_frees_memory_everywhere():
    sched, _ = make(max_prefill=16, chunk=8)
    a, b, c = req("a", 10, 50), req("b", 40, 50), req("c", 10, 50)
    for r in (a, b, c):
        sched.add_request(r)
    for _ in range(4):
        sched.step()  # a decoding, b mid-chunk, c waiting
    assert len(a.output_ids) > 0 and c.kv_len == 0
    assert sched.chunked_req is b and 0 < b.kv_len < len(b.input_ids)
    for r in (a, b, c):
        sched.abort(r.rid)
    sched.step()
    assert all(r.finished_reason["type"] == "abort" for r in (a, b, c))
    assert sched.is_idle
    assert_whole(sched)


def test_finish_reasons():
    sched, _ = make()
    solo = expected_output(req("x", 8, 0).input_ids, 60)
    stop_tok = solo[5]
    first = solo.index(stop_tok)
    r_stop = req("x", 8, 60, stop_token_ids=[stop_tok])
    r_min = req("x", 8, 60, stop_token_ids=[stop_tok], min_new_tokens=first + 2)
    r_len = req("x", 8, 3)
    r_zero = req("x", 8, 0)
    for i, r in enumerate((r_stop, r_min, r_len, r_zero)):
        r.rid = f"x{i}"
        sched.add_request(r)
    drain(sched)
    assert r_stop.output_ids == solo[: first + 1]
    assert r_stop.finished_reason == {"type": "stop", "matched": stop_tok}
    assert len(r_min.output_ids) >= first + 2  # min_new_tokens: the early stop id did not finish it
    assert r_len.finished_reason == {"type": "length", "length": 3} and len(r_len.output_ids) == 3
    assert r_zero.output_ids == [] and r_zero.finished_reason == {"type": "length", "length": 0}
    assert_whole(sched)


def test_eos_finishes_unless_ignored():
    base = req("e", 6, 0)
    solo = expected_output(base.input_ids, 200)
    eos = solo[10]
    sched, _ = make(eos=eos)
    r = req("e", 6, 200, ignore_eos=False)
    r2 = req("e", 6, 200)
    r2.rid = "e2"
    sched.add_request(r)
    sched.add_request(r2)
    drain(sched)
    assert r.output_ids == solo[: solo.index(eos) + 1]
    assert r.finished_reason == {"type": "stop", "matched": eos}
    assert len(r2.output_ids) == 200
    assert_whole(sched)


def test_scheduler_modules_do_not_import_torch():
    import subprocess

    code = ("import sys; import radixlang_runtime.scheduler.scheduler, radixlang_runtime.scheduler.policy, "
            "radixlang_runtime.mem.allocator, radixlang_runtime.protocol.sampling_params, "
            "radixlang_runtime.server_args; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def shared(rid, prefix, n_unique, max_new, seed=0, **sp) -> Req:
    r = req(rid, n_unique, max_new, seed, **sp)
    r.input_ids = list(prefix) + r.input_ids
    return r


@pytest.mark.parametrize("page_size", [1, 16])
def test_shared_prefix_is_computed_once(page_size):
    sched, runner = make(page_size=page_size, max_prefill=4096)
    prefix = req("p", 100, 0).input_ids
    reqs = [shared(f"s{i}", prefix, 10, 8) for i in range(8)]
    for r in reqs:  # all arrive together: the in-batch check lets one compute the prefix first
        sched.add_request(r)
    drain(sched)
    aligned = 100 // page_size * page_size
    assert reqs[0].cached_len == 0
    assert all(r.cached_len >= aligned for r in reqs[1:])  # (random unique parts may share a token more)
    assert sched.admission.prefill_tokens_computed == sum(110 - r.cached_len for r in reqs) <= 110 + 7 * (110 - aligned)
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, 8), r.rid
    assert_whole(sched)
    # A later request reuses the prompt *and* the generated tokens of a finished one.
    again = req("again", 0, 4)
    again.input_ids = reqs[3].input_ids + reqs[3].output_ids[:-1] + [5]
    sched.add_request(again)
    drain(sched)
    assert again.cached_len == (len(again.input_ids) - 1) // page_size * page_size
    assert again.output_ids == expected_output(again.input_ids, 4)
    assert_whole(sched)


def test_one_shared_page_is_worth_a_round():
    """A burst sharing one 16-token page (fewer than IN_BATCH_SHARE_THRESHOLD tokens): the page is computed
    once, as when the requests come one at a time (a few-shot prompt's tail + a question's start)."""
    sched, _ = make(page_size=16, max_prefill=4096)
    prefix = req("p", 20, 0).input_ids
    reqs = [shared(f"s{i}", prefix, 10, 2, seed=i + 1) for i in range(4)]
    for r in reqs:
        sched.add_request(r)
    drain(sched)
    assert [r.cached_len for r in reqs] == [0, 16, 16, 16]
    assert sched.admission.prefill_tokens_computed == 30 + 3 * 14
    assert_whole(sched)


def test_without_radix_cache_nothing_is_shared():
    sched, runner = make(radix=False)
    prefix = req("p", 100, 0).input_ids
    reqs = [shared(f"s{i}", prefix, 10, 8) for i in range(4)]
    for r in reqs:
        sched.add_request(r)
    drain(sched)
    assert all(r.cached_len == 0 for r in reqs) and runner.cached_prefix_tokens == 0
    assert sched.admission.prefill_tokens_computed == 4 * 110
    assert sched.allocator.available_size() == sched.allocator.total_slots
    assert_whole(sched)


@pytest.mark.parametrize("page_size", [1, 16])
def test_cache_evicts_lru_when_the_pool_fills(page_size):
    sched, _ = make(num_slots=512, page_size=page_size)
    for i in range(20):  # 20 x 90 tokens pass through a 512-slot pool, one at a time
        r = req(f"e{i}", 80, 10)
        sched.add_request(r)
        drain(sched)
        assert r.output_ids == expected_output(r.input_ids, 10)
        assert_whole(sched)
    assert 0 < sched.kv.cached_size() <= 512
    # The most recent request is still cached; the first was evicted.
    first, last = req("e0", 80, 1), req("e19", 80, 1)
    first.rid, last.rid = "f", "l"
    sched.add_request(last)
    drain(sched)
    assert last.cached_len == 79 // page_size * page_size
    sched.add_request(first)
    drain(sched)
    assert first.cached_len < page_size * 2 if page_size == 1 else first.cached_len == 0  # (a chance shared token)


def test_flush_cache_refused_while_busy():
    sched, _ = make()
    r = req("a", 50, 20)
    sched.add_request(r)
    sched.step()
    assert not sched.flush_cache()
    drain(sched)
    assert sched.kv.cached_size() > 0
    assert sched.flush_cache()
    assert sched.kv.cached_size() == 0 and sched.allocator.available_size() == sched.allocator.total_slots
    r2 = req("a", 50, 20)
    r2.rid = "a2"
    sched.add_request(r2)
    drain(sched)
    assert r2.cached_len == 0 and r2.output_ids == r.output_ids


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight"])
def test_cache_aware_policies_put_cached_prefixes_first(policy):
    sched, _ = make(policy=policy, max_prefill=64, chunk=64)
    warm = req("w", 60, 1)
    sched.add_request(warm)
    drain(sched)
    cold = [req(f"c{i}", 40, 1) for i in range(3)]
    hot = [shared(f"h{i}", warm.input_ids[:48], 8, 1, seed=i) for i in range(2)]
    for r in cold + hot:
        sched.add_request(r)
    batch = sched.get_next_batch_to_run()
    assert [r.rid for r in batch.reqs][:2] == ["h0", "h1"]  # 16 + 16 new tokens fit before any 40-token cold one
    sched._process_batch_result(batch, sched.runner.forward(batch.model_batch()))
    drain(sched)
    assert_whole(sched)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("page_size", [1, 16])
def test_random_traffic_keeps_outputs_and_memory(seed, page_size):
    """Arrivals, shared prefixes, aborts, retraction and eviction together; the runner and
    check_integrity (every step) verify each slot; every surviving request gets its solo output."""
    rng = random.Random(seed)
    radix = seed % 3 != 0
    policy = ["fcfs", "lpm", "dfs-weight"][seed % 3]
    mixed = seed % 2 == 1
    sched, _ = make(num_slots=rng.choice([384, 768, 2048]), page_size=page_size, max_prefill=rng.choice([64, 256]),
                    chunk=rng.choice([32, 128, -1]), ratio=rng.choice([0.05, 0.7]), radix=radix, policy=policy)
    sched.cfg.enable_mixed_chunk = mixed
    prefixes = [req(f"p{i}", rng.randrange(10, 120), 0, seed).input_ids for i in range(3)]
    reqs, aborted = [], set()
    for step in range(400):
        if len(reqs) < 40 and rng.random() < 0.3:
            r = shared(f"q{len(reqs)}", rng.choice(prefixes)[: rng.randrange(0, 120)], rng.randrange(1, 30),
                       rng.randrange(1, 40), seed)
            reqs.append(r)
            sched.add_request(r)
        if reqs and rng.random() < 0.03:
            victim = rng.choice(reqs)
            aborted.add(victim.rid)
            sched.abort(victim.rid)
        sched.step()
    drain(sched)
    for r in reqs:
        assert r.finished
        if r.finished_reason["type"] == "abort":
            assert r.rid in aborted
            continue
        assert r.output_ids == expected_output(r.input_ids, r.sampling.max_new_tokens), r.rid
    assert_whole(sched)


def test_decode_interleaves_with_prefill_chunks():
    sched, runner = make(max_prefill=64, chunk=64)
    short = req("short", 8, 40)
    sched.add_request(short)
    sched.step()  # short prefilled, now decoding
    long = req("long", 600, 4)
    sched.add_request(long)
    drain(sched)
    phases = [p for p, _, _ in sched.recent_batches]
    chunk_steps = [i for i, p in enumerate(phases) if p == "extend" and i >= 1]  # step 0: short's prefill
    assert len(chunk_steps) >= 9  # 600 tokens / 64
    for a, b in zip(chunk_steps, chunk_steps[1:]):
        assert "decode" in phases[a + 1 : b], "two chunks ran back to back while a request was decoding"
    assert short.output_ids == expected_output(short.input_ids, 40)
    assert long.output_ids == expected_output(long.input_ids, 4)
    assert_whole(sched)


@pytest.mark.parametrize("page_size", [1, 16])
def test_mixed_chunk_runs_decode_inside_prefill_batches(page_size):
    sched, _ = make(page_size=page_size, max_prefill=64, chunk=64)
    sched.cfg.enable_mixed_chunk = True
    reqs = [req("a", 8, 30), req("b", 300, 10), req("c", 50, 20)]
    sched.add_request(reqs[0])
    sched.step()
    for r in reqs[1:]:
        sched.add_request(r)
    drain(sched)
    phases = [p for p, _, _ in sched.recent_batches]
    assert "mixed" in phases
    assert phases.count("mixed") >= 4  # a decoded inside b's chunks (300 tokens / 64) instead of between them
    for r in reqs:
        assert r.output_ids == expected_output(r.input_ids, r.sampling.max_new_tokens), r.rid
    assert_whole(sched)


def test_prefill_adder_reports_each_budget():
    from radixlang_runtime.scheduler.policy import AddResult, PrefillAdder

    def adder(**kw):
        base = dict(page_size=1, rem_total_tokens=1000, rem_input_tokens=100, rem_chunk_tokens=-1, rem_rows=4,
                    rem_running=4, new_token_ratio=0.5, running_empty=False)
        return PrefillAdder(**{**base, **kw})

    a = adder(rem_rows=0)
    assert a.add_one(req("x", 10, 10), holds_row=False) == AddResult.OTHER and a.stop_reason == "rows"
    a = adder(rem_running=0)
    assert a.add_one(req("x", 10, 10), holds_row=False) == AddResult.OTHER and a.stop_reason == "max_running"
    a = adder(rem_input_tokens=15)
    assert a.add_one(req("x", 10, 10), holds_row=False) == AddResult.CONTINUE  # 10 of 15 input tokens
    assert a.add_one(req("y", 10, 10), holds_row=False) == AddResult.OTHER and a.stop_reason == "chunked"
    assert a.admitted[-1].extend_len == 5 and not a.admitted[-1].is_last_chunk
    assert a.add_one(req("z", 10, 10), holds_row=False) == AddResult.NO_TOKEN and a.stop_reason == "input_tokens"
    # KV: 10 prompt + 0.5 x 100 reserved = 60 > 59; fits exactly at 60.
    a = adder(rem_total_tokens=59)
    assert a.add_one(req("x", 10, 100), holds_row=False) == AddResult.NO_TOKEN and a.stop_reason == "kv_tokens"
    a = adder(rem_total_tokens=60)
    assert a.add_one(req("x", 10, 100), holds_row=False) == AddResult.CONTINUE and a.rem_total_tokens == 0
    # With nothing decoding the head request runs if its prompt fits, reservation or not.
    a = adder(rem_total_tokens=10, running_empty=True)
    assert a.add_one(req("x", 10, 100), holds_row=False) == AddResult.CONTINUE
    # The per-request chunk cuts a long prompt; page size rounds the KV it takes.
    a = adder(rem_chunk_tokens=32, page_size=16, rem_total_tokens=1000)
    assert a.add_one(req("x", 40, 4), holds_row=False) == AddResult.OTHER
    assert a.admitted[0].extend_len == 32 and a.rem_total_tokens == 1000 - 32 and a.rem_input_tokens == 68


def test_short_arrivals_join_a_long_prompts_chunks():
    """A short request arriving mid-way through a chunked prompt is prefilled in the next chunk step
    (taking at most half of it) instead of waiting for the last chunk."""
    sched, _ = make(max_prefill=4096, chunk=64)
    long = req("long", 1000, 2)
    sched.add_request(long)
    sched.step()
    sched.step()
    short = req("short", 20, 3)
    sched.add_request(short)
    sched.step()
    assert short.output_ids and not long.output_ids  # the short one got its first token first
    phase, size, tokens = sched.recent_batches[-1]
    assert phase == "extend" and size == 2 and tokens == 64  # one chunk's worth in all: 20 + 44
    drain(sched)
    assert long.output_ids == expected_output(long.input_ids, 2)
    assert short.output_ids == expected_output(short.input_ids, 3)
    assert_whole(sched)
