"""model/memory.py: the CPU KV pool sized from the memory available after warm-up, lazily committed,
and the breakdown the stats report (on the real model for the default sizing)."""

from __future__ import annotations

import torch

from radixlang_runtime.model import memory


def test_budget_rule():
    gib = 1 << 30
    assert memory.cpu_kv_budget(None, 20 * gib) == memory.DEFAULT_CPU_KV_CAP  # 0.4 x 20 GiB, capped
    assert memory.cpu_kv_budget(None, 2 * gib) == int(0.4 * 2 * gib)
    assert memory.cpu_kv_budget(0.5, 20 * gib) == 10 * gib  # an explicit fraction is not capped
    assert memory.cpu_kv_budget(None, 1 << 20) == memory.MIN_CPU_KV
    assert memory.cpu_kv_budget(None, None) == gib  # no /proc/meminfo


def test_kv_block_is_zero_and_large_blocks_are_not_resident_until_written():
    small = memory.kv_block((2, 3, 4), torch.bfloat16, torch.device("cpu"))
    assert not small.any()
    before = memory.rss_bytes()
    big = memory.kv_block((2, 1024, 1024, 64), torch.bfloat16, torch.device("cpu"))  # 256 MiB
    assert memory.rss_bytes() - before < 32 << 20, "a large pool must not be committed at allocation"
    assert not big[1, 1000].any() and not big[0, 3].any()  # fresh pages read as zero
    big[0, :8] = 1.0  # 8 x 1024 x 64 x 2 bytes = 1 MiB written: now resident
    assert memory.rss_bytes() - before >= 1 << 20
    del big


def test_default_engine_sizes_from_free_memory_and_reports_its_memory():
    from radixlang_runtime import Engine

    before = memory.rss_bytes()  # the test process may hold other engines
    with Engine(dtype="bfloat16") as eng:
        st = eng.get_stats()
        mem = st["memory"]
        avail = mem["available_after_warmup"]
        assert avail is not None and avail > 0
        assert mem["kv_pool"] <= max(memory.MIN_CPU_KV, min(memory.DEFAULT_CPU_KV_CAP, 0.4 * avail)) + (1 << 20)
        per_slot = mem["kv_pool"] // st["total_slots"]
        assert per_slot == 30 * 2 * 3 * 64 * 2  # layers x (K, V) x KV heads x head_dim x bf16
        assert 200 << 20 < mem["weights"] < 1000 << 20  # SmolLM2-135M in bf16 + oneDNN-packed copies + tiles
        # the 4 GiB pool is reserved, not resident: this engine's share of the RSS is weights and libraries
        assert mem["kv_touched"] == 0 and mem["rss"] - before < mem["weights"] + (512 << 20) < mem["kv_pool"]
        eng.generate("The capital of France is", {"max_new_tokens": 4, "temperature": 0})
        mem = eng.get_stats()["memory"]
        assert 0 < mem["kv_touched"] <= mem["kv_pool"]


def test_mem_fraction_static_sizes_the_cpu_pool():
    from radixlang_runtime import Engine

    with Engine(dtype="bfloat16", mem_fraction_static=0.01) as eng:
        mem = eng.get_stats()["memory"]
        want = max(memory.MIN_CPU_KV, int(0.01 * mem["available_after_warmup"]))
        assert abs(mem["kv_pool"] - want) <= 16 * mem["kv_pool"] // eng.get_stats()["total_slots"]
