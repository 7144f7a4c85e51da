"""The capability mask (RADIXLANG_CPU_MASK): the real Engine / server started under it on this machine (every
fallback runs whatever the CPU). What the mask hides and the kernel build it selects:
kernels/tests/test_cpu_caps.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from radixlang_kernels.cpu_caps import MASK_ENV

ENGINE_SCRIPT = r"""
import json, sys
from radixlang_runtime import Engine
eng = Engine(max_total_tokens=4096, debug_check_integrity=True)
ids = eng.tokenizer.encode("The capital of France is", add_special_tokens=False)
out = eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 12, "temperature": 0, "ignore_eos": True})
print(json.dumps({"ids": ids, "out": out["output_ids"], "cpu": eng.get_stats()["cpu"]}))
eng.shutdown()
"""


@pytest.mark.parametrize("mask,decode",
                         [("avx512_bf16", "c:avx512"), ("avx2", "c:scalar"), ("avx2,cc", "torch:sdpa-gather")])
def test_engine_under_mask_defaults_to_fp32_and_matches_transformers(mask, decode, hf_greedy):
    from radixlang_kernels.cpu_caps import detect

    real = detect()
    if mask != "cc" and real.isa in ("avx2", "scalar") and mask == "avx512_bf16":
        pytest.skip("this CPU has no AVX-512 to mask down from")
    env = dict(os.environ, **{MASK_ENV: mask})
    res = subprocess.run([sys.executable, "-c", ENGINE_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    cpu = got["cpu"]
    assert cpu["dtype"] == "float32" and not cpu["native_bf16"]  # no bf16 dot products: fp32 by default
    if real.arch == "x86_64" and real.compiler is not None:
        assert cpu["paths"]["decode_attention"] == decode
    assert got["out"] == hf_greedy(got["ids"], 12)


def test_server_under_strongest_mask_serves_bf16():
    from server_utils import ServerProcess

    os.environ[MASK_ENV] = "avx2,cc"
    try:
        srv = ServerProcess("--dtype", "bfloat16", "--max-total-tokens", "4096")
    finally:
        del os.environ[MASK_ENV]
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            r = c.post("/generate", json={"text": "The capital of France is",
                                          "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
            assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] > 0
            cpu = c.get("/server_info").json()["stats"]["cpu"]
            assert cpu["mask"] == ["avx2", "avx512", "avx512_bf16", "avx512_vnni", "cc"] and cpu["dtype"] == "bfloat16"
            assert cpu["paths"]["decode_attention"].startswith("torch")
    finally:
        assert srv.stop() in (0, 143), srv.tail()
