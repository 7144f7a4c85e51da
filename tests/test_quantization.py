"""--quantization int8 on the real model (the kernel itself is checked against dequantize-then-matmul
per ISA in test_cpu_kernels): the Engine answers sensibly in one stream (C kernel) and in a batch
above the kernel's M (packed dequantized path), reports its path, and the allocator is whole.
Greedy text may drift from the unquantized model's (int8 rounding), so it is not compared token for
token; the top choice of the first token must be among the unquantized model's top 5."""

from __future__ import annotations

import pytest

from conftest import assert_whole, wait_idle
from radixlang_runtime import Engine
from radixlang_runtime.server_args import ServerArgs

pytestmark = pytest.mark.slow

CHAT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def test_only_int8_is_accepted():
    with pytest.raises(ValueError, match="only int8"):
        ServerArgs(quantization="q4_1")


def test_int8_engine(engine):
    eng = Engine(quantization="int8", max_total_tokens=4096)
    try:
        assert eng.get_stats()["cpu"]["paths"]["linear"].startswith("int8:")
        one = eng.generate(CHAT, {"max_new_tokens": 16, "temperature": 0})
        assert "Paris" in one["text"], one["text"]
        batch = eng.generate([f"Count to {i}:" for i in range(20)], {"max_new_tokens": 6, "temperature": 0})
        assert all(o["meta_info"]["completion_tokens"] == 6 for o in batch)
        sp = {"max_new_tokens": 1, "temperature": 0}
        q_first = eng.generate(CHAT, sp)["output_ids"][0]
        ref_top = engine.generate(CHAT, sp, return_logprob=True, top_logprobs_num=5)["meta_info"]["output_top_logprobs"][0]
        assert q_first in [t[1] for t in ref_top], (q_first, ref_top)
        wait_idle(eng)
        assert_whole(eng)
    finally:
        eng.shutdown()
