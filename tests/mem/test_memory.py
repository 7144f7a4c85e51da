"""kv_memory.py + executor/memory.py: the CPU KV pool sized from the memory available after warm-up, lazily committed,
and the breakdown the stats report (on the real model for the default sizing); tune_malloc's step
buffers."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import torch

from radixlang_runtime.mem import kv_memory
from radixlang_runtime.model.executor import memory


def test_budget_rule():
    gib = 1 << 30
    assert kv_memory.cpu_kv_budget(None, 20 * gib) == kv_memory.DEFAULT_CPU_KV_CAP  # 0.4 x 20 GiB, capped
    assert kv_memory.cpu_kv_budget(None, 2 * gib) == int(0.4 * 2 * gib)
    assert kv_memory.cpu_kv_budget(0.5, 20 * gib) == 10 * gib  # an explicit fraction is not capped
    assert kv_memory.cpu_kv_budget(None, 1 << 20) == kv_memory.MIN_CPU_KV
    assert kv_memory.cpu_kv_budget(None, None) == gib  # no /proc/meminfo


def test_kv_block_is_zero_and_large_blocks_are_not_resident_until_written():
    small = kv_memory.kv_block((2, 3, 4), torch.bfloat16, torch.device("cpu"))
    assert not small.any()
    before = memory.rss_bytes()
    big = kv_memory.kv_block((2, 1024, 1024, 64), torch.bfloat16, torch.device("cpu"))  # 256 MiB
    assert memory.rss_bytes() - before < 32 << 20, "a large pool must not be committed at allocation"
    assert not big[1, 1000].any() and not big[0, 3].any()  # fresh pages read as zero
    big[0, :8] = 1.0  # 8 x 1024 x 64 x 2 bytes = 1 MiB written: now resident
    assert memory.rss_bytes() - before >= 1 << 20
    del big


# A child process (malloc's settings are process-wide): buffers of 1-40 MB allocated, written and freed
# in turn, as a step's are, on the main thread and on another one; it prints the page faults taken
# after a warm-up and the pages written. Argument 1: tune_malloc first.
_STEP_BUFFERS = """
import resource, sys, threading, torch
from radixlang_runtime.model.executor import memory
applied = memory.tune_malloc() if sys.argv[1] == "1" else False
sizes = [(1 + (i * 7919) % 40) << 18 for i in range(60)]  # floats: 1 .. 40 MB
def work(out):
    for s in sizes[:10]:
        torch.empty(s).fill_(1.0)
    f0, pages = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, 0
    for s in sizes[10:]:
        a = torch.empty(s); a.fill_(1.0); b = torch.empty(s // 3); b.fill_(2.0); del a
        pages += (s + s // 3) * 4 // 4096
    out.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0, pages))
out = []
work(out)
t = threading.Thread(target=work, args=(out,)); t.start(); t.join()
print(applied, *[x for pair in out for x in pair])
"""


def _step_buffer_faults(tune: bool, env: dict) -> tuple[bool, list[float]]:
    res = subprocess.run([sys.executable, "-c", _STEP_BUFFERS, "1" if tune else "0"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    applied, *counts = res.stdout.split()
    n = [int(x) for x in counts]  # faults, pages: main thread, then the other thread
    return applied == "True", [n[0] / n[1], n[2] / n[3]]


def test_tune_malloc_keeps_step_buffers_resident():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    applied, tuned = _step_buffer_faults(True, env)
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        assert not applied
        return
    assert applied
    _, plain = _step_buffer_faults(False, env)
    # measured: tuned ~4% of the written pages faulted (heap growth to a new largest size), plain 28-31%
    assert all(f < 0.1 for f in tuned), (tuned, plain)
    assert all(t < p for t, p in zip(tuned, plain)), (tuned, plain)
    # the user's own malloc settings win
    applied, _ = _step_buffer_faults(True, {**env, "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"})
    assert not applied


def test_default_engine_sizes_from_free_memory_and_reports_its_memory():
    from radixlang_runtime import Engine

    before = memory.rss_bytes()  # the test process may hold other engines
    with Engine(dtype="bfloat16") as eng:
        st = eng.get_stats()
        mem = st["memory"]
        avail = mem["available_after_warmup"]
        assert avail is not None and avail > 0
        assert mem["kv_pool"] <= max(kv_memory.MIN_CPU_KV, min(kv_memory.DEFAULT_CPU_KV_CAP, 0.4 * avail)) + (1 << 20)
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
        want = max(kv_memory.MIN_CPU_KV, int(0.01 * mem["available_after_warmup"]))
        assert abs(mem["kv_pool"] - want) <= 16 * mem["kv_pool"] // eng.get_stats()["total_slots"]
