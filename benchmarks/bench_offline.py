"""Offline throughput: radixlang's Engine against transformers `generate` (static batching).

Workloads (the same token ids for every system):
  W1  64 prompts x 256 random token ids -> 128 new tokens each, greedy, EOS ignored
  W2  1 prompt of 32 tokens -> 256 new tokens, greedy, EOS ignored
RADIXLANG_CPU_MASK in the environment applies to every child (it also caps oneDNN, so transformers
runs as it would on such a CPU). Each system runs in its own child process (no shared thread pools or allocator state)
and each workload is timed --runs times after a warm-up (radixlang flushes its prefix cache before each run:
the prompts repeat across runs); the table shows medians of output tokens/s, the
ratios against transformers at its default dtype (float32, as the checkpoint is stored) and at
bfloat16 (radixlang's CPU default), and each child's peak RSS.

    python benchmarks/bench_offline.py                 # full: 3 runs, both baselines
    python benchmarks/bench_offline.py --runs 1 --quick
    python benchmarks/bench_offline.py --quantization int8   # also the weight-only int8 linears
    python benchmarks/bench_offline.py --deterministic       # also --enable-deterministic-inference
    python benchmarks/bench_offline.py --lora                # also LoRA (4 rank-16 adapters): base, 1, over 4 (x2)
    python benchmarks/bench_offline.py --model-path DIR --fallback   # also --model-impl transformers (its cost)
    python benchmarks/bench_offline.py --random-model moe --quick    # a random checkpoint (random_checkpoint.py)
    python benchmarks/bench_offline.py --peers vllm,llamacpp --quantization gguf   # + peers, same ids
    python benchmarks/bench_offline.py --peers llamacpp --model-path FILE.gguf --masks ,avx512_bf16

--peers runs ../shared/peers' scripts (vLLM-CPU; llama.cpp BF16 with flash attention for W1, BF16 /
Q8_0 / Q4_1 single stream for W2), each in its own venv under $PEERS_DIR (default /tmp/peers; install
with ../shared/peers/install_vllm.sh and build_llamacpp.sh; a peer not installed is reported, not run),
on the token ids of ../shared/peers/workloads.py (which then replace ours, fingerprints printed), plus
that directory's bench_phys.py (GEMM and memory-read ceilings in the same run). Peer W2 figures are
their decode tok/s (tokens 2..256 over their time); ours are output tokens over the whole call.
With --peers llamacpp and a .gguf --model-path, the file itself runs on both sides instead: llama.cpp's own
C++ tools (llama-bench, llama-batched-bench) against radixlang, decode tok/s of one stream and of 16 / 64
streams, rounds interleaved (gguf_side_by_side.py).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import time

from bench_common import in_child
from bench_peers import PEER_RUNS, default_peers_dir, peer_workloads, physical_ceilings, run_peers
from random_checkpoint import SHAPES
from random_checkpoint import build as build_random

VOCAB_LO, VOCAB_HI = 100, 49000


def workloads(quick: bool) -> dict[str, dict]:
    import random

    rng = random.Random(0)
    n1, l1, o1 = (16, 128, 32) if quick else (64, 256, 128)
    n2, o2 = 32, (64 if quick else 256)
    return {
        "W1": {"ids": [[rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(l1)] for _ in range(n1)], "new": o1},
        "W2": {"ids": [[rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(n2)]], "new": o2},
    }


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_radixlang(model_dir: str, wls: dict, runs: int, engine_args: dict, out: mp.Queue,
                  adapters: int = 0) -> None:
    """adapters: with --lora-paths in engine_args, the requests spread round-robin over this many (0: the base)."""
    from radixlang_runtime import Engine

    eng = Engine(model_dir, **engine_args)
    res = {}
    try:
        eng.generate(input_ids=wls["W2"]["ids"][0], sampling_params={"max_new_tokens": 8, "temperature": 0})
        for name, wl in wls.items():
            sp = {"max_new_tokens": wl["new"], "temperature": 0, "ignore_eos": True}
            rates = []
            for _ in range(runs):
                assert eng.flush_cache()  # the same prompts every run: no reuse from the previous one
                t = time.perf_counter()
                lora = [f"lora{i % adapters}" for i in range(len(wl["ids"]))] if adapters else None
                outs = eng.generate(input_ids=wl["ids"], sampling_params=sp, lora_path=lora)
                dt = time.perf_counter() - t
                rates.append(sum(o["meta_info"]["completion_tokens"] for o in outs) / dt)
            res[name] = rates
        res["dtype"] = str(eng.runner.dtype).replace("torch.", "")
        res["cpu"] = eng.get_stats()["cpu"]
        res["peak_rss_mb"] = _peak_rss_mb()
    finally:
        eng.shutdown()
    out.put(res)


def run_radixlang_lora(model_dir: str, wls: dict, runs: int, engine_args: dict, adapters: int, out: mp.Queue) -> None:
    run_radixlang(model_dir, wls, runs, engine_args, out, adapters)


def run_transformers(model_dir: str, dtype_name: str, wls: dict, runs: int, out: mp.Queue) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, dtype_name)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    res = {}
    with torch.inference_mode():
        warm = torch.tensor(wls["W2"]["ids"])
        model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=8, do_sample=False, pad_token_id=2)
        for name, wl in wls.items():
            ids = torch.tensor(wl["ids"])  # equal lengths: static batching without padding
            rates = []
            for _ in range(runs):
                t = time.perf_counter()
                gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=wl["new"],
                                     min_new_tokens=wl["new"], do_sample=False, pad_token_id=2)
                dt = time.perf_counter() - t
                rates.append((gen.shape[1] - ids.shape[1]) * ids.shape[0] / dt)
            res[name] = rates
    res["dtype"] = dtype_name
    res["peak_rss_mb"] = _peak_rss_mb()
    out.put(res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smaller workloads (a smoke run)")
    ap.add_argument("--baseline-dtypes", default="float32,bfloat16", help="transformers' dtypes ('' for none)")
    ap.add_argument("--model-path", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--random-model", default=None, choices=sorted(SHAPES),
                    help="a random checkpoint of that shape (random_checkpoint.py), built once under --random-dir")
    ap.add_argument("--random-dir", default="/tmp/radixlang-random-models")
    ap.add_argument("--json", default=None, help="also write the raw numbers here")
    ap.add_argument("--dtype", default="auto",
                    help="radixlang's dtype (auto: chosen per CPU, see executor/device.resolve_dtype)")
    ap.add_argument("--quantization", default=None, help="also run radixlang with this --quantization (int8, gguf)")
    ap.add_argument("--deterministic", action="store_true",
                    help="also run radixlang with --enable-deterministic-inference (the mode's cost, same run)")
    ap.add_argument("--lora", action="store_true", help="also LoRA: 4 random rank-16 adapters on every projection "
                    "(over 4 twice: --lora-backend csgmv and torch_native)")
    ap.add_argument("--fallback", action="store_true",
                    help="also run radixlang with --model-impl transformers (the fallback's cost, same run)")
    ap.add_argument("--peers", default="", help="comma list of vllm, llamacpp (see above)")
    ap.add_argument("--peers-dir", default=None, help="the peer scripts (default: ../shared/peers next to the repo)")
    ap.add_argument("--peer-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="vLLM-CPU's dtype: float32 is what it runs on a CPU without AVX512-BF16 (with "
                         "RADIXLANG_CPU_MASK=avx512_bf16 for ours: the second table)")
    ap.add_argument("--masks", default="",
                    help="with a .gguf --model-path and --peers llamacpp: comma list of RADIXLANG_CPU_MASK values "
                         "radixlang runs under ('' = none; ',avx512_bf16' = without and with the mask)")
    a = ap.parse_args()
    if a.peers == "llamacpp" and a.model_path and a.model_path.endswith(".gguf"):
        from gguf_side_by_side import report, side_by_side

        path = os.path.abspath(a.model_path)
        rounds = side_by_side(path, a.runs, a.masks.split(","), quick=a.quick, dtype=a.dtype)
        print("\n" + report(path, rounds))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rounds, f, indent=2)
        return

    from radixlang_runtime.model.loader.resolve import resolve_model_dir

    if a.random_model and a.model_path:
        ap.error("--random-model and --model-path name two models: give one")
    if a.random_model:
        a.model_path = build_random(a.random_model, f"{a.random_dir}/{a.random_model}")
    model_dir = resolve_model_dir(a.model_path)
    peers = [p for p in a.peers.split(",") if p]
    unknown = sorted(set(peers) - set(PEER_RUNS))
    if unknown:
        ap.error(f"unknown peer(s) {unknown}: choose from {sorted(PEER_RUNS)} (transformers is always run)")
    peers_dir = a.peers_dir or default_peers_dir()
    wls = {w: v for w, v in peer_workloads(peers_dir).items() if w in ("W1", "W2")} if peers else workloads(a.quick)
    results = {"radixlang": in_child(run_radixlang, model_dir, wls, a.runs, {"dtype": a.dtype})}
    if a.quantization:
        results[f"radixlang-{a.quantization}"] = in_child(run_radixlang, model_dir, wls, a.runs,
                                                          {"dtype": a.dtype, "quantization": a.quantization})
    if a.deterministic:
        results["radixlang-deterministic"] = in_child(run_radixlang, model_dir, wls, a.runs,
                                                      {"dtype": a.dtype, "enable_deterministic_inference": True})
    if a.lora:  # the same server with 4 adapters loaded: every request on the base, on one adapter, over 4
        from lora_bench_adapters import build_adapters

        paths = build_adapters(model_dir, f"{a.random_dir}/lora-adapters", 4)
        for label, n, backend in (("base", 0, "csgmv"), ("1-adapter", 1, "csgmv"), ("4-adapters", 4, "csgmv"),
                                  ("4-adapters-torch", 4, "torch_native")):
            results[f"radixlang-lora-{label}"] = in_child(run_radixlang_lora, model_dir, wls, a.runs,
                                                          {"dtype": a.dtype, "lora_paths": paths,
                                                           "lora_backend": backend}, n)
    if a.fallback:
        results["radixlang-transformers-impl"] = in_child(run_radixlang, model_dir, wls, a.runs,
                                                          {"dtype": a.dtype, "model_impl": "transformers"})
    for dt in [d for d in a.baseline_dtypes.split(",") if d]:  # "" runs no transformers baseline
        results[f"transformers-{dt}"] = in_child(run_transformers, model_dir, dt, wls, a.runs)
    if peers:
        results.update(run_peers(peers, peers_dir, a.runs, model_dir, ("W1", "W2"), a.peer_dtype))

    nan = float("nan")
    med = {k: {w: statistics.median(v[w]) if v.get(w) else nan for w in wls} for k, v in results.items()}
    print(f"\nmodel {model_dir}\nruns per workload: {a.runs} (medians below)")
    print(f"radixlang CPU: {results['radixlang']['cpu']}")
    print(f"{'system':<24} {'dtype':<9} {'W1 tok/s':>10} {'W2 tok/s':>10} {'peak RSS MB':>12}")
    for k, v in results.items():
        print(f"{k:<24} {v['dtype']:<9} {med[k]['W1']:>10.1f} {med[k]['W2']:>10.1f} {v['peak_rss_mb']:>12.0f}"
              + (f"  {v['error']}" if v.get("error") else ""))
    others = [k for k in results if not k.startswith("radixlang")]
    for ours in [k for k in results if k.startswith("radixlang")]:
        for k in others:  # the workloads a system ran (a NaN median: it did not run that one)
            ratios = [f"{w} {med[ours][w] / med[k][w]:.2f}x" for w in wls if med[k][w] == med[k][w]]
            if ratios:
                print(f"{ours} / {k}: " + "  ".join(ratios))
        for w in wls:
            best = max((k for k in others if med[k][w] == med[k][w]), key=lambda k: med[k][w], default=None)
            if best is not None:
                print(f"{ours} / best peer on {w} ({best}): {med[ours][w] / med[best][w]:.2f}x")
    if peers:
        print("\nphysical ceilings (bench_phys.py, same run):\n" + physical_ceilings(peers_dir, model_dir))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results, "medians": med}, f, indent=2)


if __name__ == "__main__":
    main()
