"""LoRA in the scheduler core (fake runner, no torch): the radix cache keyed per adapter, every step's ModelBatch
carrying each request's adapter, and max_loras_per_batch bounding the distinct adapters of a running batch."""

from __future__ import annotations

import dataclasses

from fakes import expected_output
from scheduler_utils import assert_whole, drain, make, req


def lora_req(rid, lora_id, n_prompt=40, max_new=6, seed=0):
    r = req(rid, n_prompt, max_new, seed=seed)
    r.lora_id = lora_id
    return r


def record(runner):
    seen, orig = [], runner.forward

    def forward(batch):
        seen.append((list(batch.lora_ids), batch.phase))
        return orig(batch)

    runner.forward = forward
    return seen


def test_prefix_cache_is_per_adapter():
    sched, runner = make(page_size=16)
    first = lora_req("a1", 1)
    sched.add_request(first)
    drain(sched)
    same_prompt = [dataclasses.replace(first, rid=rid, lora_id=lid, output_ids=[], kv_indices=[],
                                       finished_reason=None) for rid, lid in (("a2", 1), ("b", 2), ("base", 0))]
    for r in same_prompt:
        sched.add_request(r)
        drain(sched)
    assert [r.cached_len for r in same_prompt] == [32, 0, 0]  # the adapter's own pages only
    base_again = dataclasses.replace(same_prompt[2], rid="base2", output_ids=[], kv_indices=[], finished_reason=None)
    sched.add_request(base_again)
    drain(sched)
    assert base_again.cached_len == 32
    for r in [first, *same_prompt, base_again]:
        assert r.output_ids == expected_output(r.input_ids, 6)
    assert_whole(sched)


def test_batches_carry_adapters_and_base_batches_carry_none():
    sched, runner = make()
    seen = record(runner)
    for r in (lora_req("x", 0, seed=1), lora_req("y", 0, seed=2)):
        sched.add_request(r)
    drain(sched)
    assert seen and all(ids == [] for ids, _ in seen)  # no adapter: the runner's base path
    seen.clear()
    for i, lid in enumerate((0, 1, 2)):
        sched.add_request(lora_req(f"m{i}", lid, seed=i))
    drain(sched)
    assert ([0, 1, 2], "extend") in seen and ([0, 1, 2], "decode") in seen
    assert_whole(sched)


def test_max_loras_per_batch_bounds_distinct_adapters():
    sched, runner = make()
    sched.cfg = dataclasses.replace(sched.cfg, max_loras_per_batch=2)
    sched.admission.cfg = sched.cfg
    seen = record(runner)
    reqs = [lora_req(f"r{i}", lid, seed=i) for i, lid in enumerate((1, 2, 3, 0, 1, 3))]
    for r in reqs:
        sched.add_request(r)
    done = drain(sched)
    assert {r.rid for r in done} == {r.rid for r in reqs}
    assert all(len(set(ids) - {0}) <= 2 for ids, _ in seen)
    assert any(3 in ids for ids, _ in seen)  # the third adapter ran once a slot freed
    assert_whole(sched)
