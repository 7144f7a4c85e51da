"""Decode speed of pre-quantized checkpoints (model/prequant/) against the same model in bf16 / float32.

The embedded SmolLM2-135M-Instruct (its converted HF directory) is written in each layout the way the
quantizing tools write it (tests/prequant_layouts.py: AutoAWQ GEMM, GPTQ, llm-compressor pack-quantized,
block FP8; group 64, since 576 is not a multiple of 128), then served by the Engine in its own process:
one stream (32-token prompt -> --new tokens, greedy, EOS ignored) and a batch of 8, output tokens/s, median
of --runs after a warm-up.

    python benchmarks/bench_prequant.py                      # bf16 and float32, every layout
    python benchmarks/bench_prequant.py --dtypes bfloat16 --layouts gptq4,awq --runs 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from bench_common import in_child

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from prequant_layouts import (quantize_awq, quantize_ct_packed, quantize_fp8, quantize_gptq,  # noqa: E402
                              write_prequant)

G = 64
LAYOUTS = {
    "gptq4": (lambda w: quantize_gptq(w, gs=G), {"quant_method": "gptq", "bits": 4, "group_size": G,
                                                 "desc_act": False, "sym": True, "checkpoint_format": "gptq"}),
    "awq": (lambda w: quantize_awq(w, gs=G), {"quant_method": "awq", "bits": 4, "group_size": G,
                                              "zero_point": True, "version": "gemm"}),
    "ct_w8a16": (lambda w: quantize_ct_packed(w, gs=-1, bits=8, scale_dtype=np.float16), {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}}}}),
    "fp8_block": (lambda w: quantize_fp8(w, (128, 128)), {"quant_method": "fp8", "activation_scheme": "dynamic",
                                                         "fmt": "e4m3", "weight_block_size": [128, 128]}),
}


def run(model_dir: str, dtype: str, new: int, runs: int, q) -> None:
    from radixlang_runtime import Engine

    eng = Engine(model_dir, dtype=dtype, max_total_tokens=8192)
    prompt = list(range(1000, 1032))
    sp = {"max_new_tokens": new, "min_new_tokens": new, "temperature": 0, "ignore_eos": True}
    out = {"linear": eng.get_stats()["cpu"]["paths"]["linear"]}
    for name, batch in (("1 stream", [prompt]), ("batch 8", [[t + i for t in prompt] for i in range(8)])):
        eng.generate(input_ids=batch, sampling_params={**sp, "max_new_tokens": 8, "min_new_tokens": 8})
        rates = []
        for _ in range(runs):
            eng.flush_cache()
            t = time.perf_counter()
            eng.generate(input_ids=batch, sampling_params=sp)
            rates.append(len(batch) * new / (time.perf_counter() - t))
        out[name] = statistics.median(rates)
    eng.shutdown()
    q.put(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from radixlang_runtime.model.loader.resolve import resolve_model_dir

    base = resolve_model_dir(None)
    work = tempfile.mkdtemp(prefix="radixlang-prequant-")
    dirs = {"float (the checkpoint)": base}
    for name in args.layouts.split(","):
        d = os.path.join(work, name)
        shutil.copytree(base, d)
        write_prequant(d, None, *LAYOUTS[name])
        dirs[name] = d
    print("| layout | dtype | 1 stream tok/s | batch 8 tok/s | linear path |\n|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        for name, d in dirs.items():
            r = in_child(run, d, dtype, args.new, args.runs)
            print(f"| {name} | {dtype} | {r['1 stream']:.1f} | {r['batch 8']:.1f} | {r['linear']} |", flush=True)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
