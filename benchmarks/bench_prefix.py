"""Prefix reuse: the Engine with the radix cache on against the same Engine with it off.

Workloads (greedy, EOS ignored, all requests submitted together):
  W3        64 requests = one shared 1,024-token prefix + 32 unique tokens -> 16 new tokens
  few-shot  64 questions (~30 tokens) after the same 8 worked examples (~610 tokens) -> 16 new tokens
Each setting runs in its own child process; every run starts from an empty cache (flush), so the
shared prefix is computed at least once per run. Reported: median wall time over --runs, prefill
tokens computed, hit rate (prompt tokens served from the cache / all prompt tokens), and the
speed-up of cache on over cache off, both measured in the same invocation.

    python benchmarks/bench_prefix.py             # 3 runs each
    python benchmarks/bench_prefix.py --runs 1
    python benchmarks/bench_prefix.py --peers vllm,llamacpp   # + W3 on vLLM-CPU and llama.cpp, same ids

--peers (bench_peers.py): W3 becomes ../shared/peers/workloads.py's W3 (same shape, the peers' ids) and
each peer runs it with its prefix reuse on and off (vLLM prefix caching; llama.cpp BF16 batch mode,
prefix decoded once and copied to every sequence); the table adds their wall times and the ratio of
ours (cache on) to the best peer's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import time

from bench_common import in_child
from bench_peers import PEER_RUNS, default_peers_dir, peer_workloads, run_peers

NEW_TOKENS = 16
# Eight worked examples in the style of GSM8K few-shot prompts (the shared part: ~610 tokens).
EXAMPLES = [
    ("A baker makes 24 rolls in the morning and 18 in the afternoon. She sells 30 of them. How many are left?",
     "She makes 24 + 18 = 42 rolls in total. After selling 30, she has 42 - 30 = 12 rolls left. The answer is 12."),
    ("Tom reads 15 pages a day. How many pages does he read in two weeks?",
     "Two weeks have 2 x 7 = 14 days. At 15 pages a day he reads 14 x 15 = 210 pages. The answer is 210."),
    ("A box holds 6 eggs. A farmer collects 75 eggs. How many full boxes can he fill, and how many eggs remain?",
     "75 divided by 6 is 12 with remainder 3, since 12 x 6 = 72. He fills 12 boxes and 3 eggs remain. "
     "The answer is 12."),
    ("A shirt costs $25 and is on sale for 20% off. What is the sale price?",
     "20% of $25 is 0.2 x 25 = $5. The sale price is 25 - 5 = $20. The answer is 20."),
    ("Maria has three times as many stickers as Ben. Together they have 48. How many does Ben have?",
     "If Ben has b stickers, Maria has 3b, so b + 3b = 4b = 48 and b = 12. The answer is 12."),
    ("A train travels at 60 km per hour for 2.5 hours. How far does it go?",
     "Distance is speed times time: 60 x 2.5 = 150 km. The answer is 150."),
    ("A garden is 12 m long and 8 m wide. A path 1 m wide runs around the inside edge. "
     "What area is left inside the path?",
     "Inside the path the garden is 12 - 2 = 10 m by 8 - 2 = 6 m, so the area is 10 x 6 = 60 square metres. "
     "The answer is 60."),
    ("Sam saves $8 a week. He wants a bike that costs $120 and already has $24. How many weeks must he save?",
     "He still needs 120 - 24 = $96. At $8 a week that takes 96 / 8 = 12 weeks. The answer is 12."),
]
ITEMS = ["apples", "pencils", "marbles", "stamps", "cookies", "coins", "books", "shells"]


def workloads(tokenizer) -> dict[str, list[list[int]]]:
    rng = random.Random(0)
    shared = [rng.randrange(100, 49000) for _ in range(1024)]
    w3 = [shared + [rng.randrange(100, 49000) for _ in range(32)] for _ in range(64)]
    shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in EXAMPLES)
    questions = [f"Question: Ann has {3 + i} bags with {5 + j} {item} each. She gives away {2 + i + j}. "
                 "How many are left?\nAnswer:"
                 for i in range(8) for j, item in enumerate(ITEMS)]
    fewshot = [tokenizer.encode(shots + q, add_special_tokens=False) for q in questions]
    return {"W3": w3, "few-shot": fewshot}


def run_setting(disable: bool, runs: int, w3_ids, out: mp.Queue) -> None:
    from radixlang_runtime import Engine

    eng = Engine(disable_radix_cache=disable)
    res: dict = {}
    try:
        wls = workloads(eng.tokenizer)
        if w3_ids is not None:  # the peers' W3 ids
            wls["W3"] = w3_ids
        sp = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
        eng.generate(input_ids=wls["W3"][0][:64], sampling_params={"max_new_tokens": 4})  # warm-up
        for name, ids in wls.items():
            times, computed, cached = [], [], []
            for _ in range(runs):
                assert eng.flush_cache()
                before = eng.get_stats()
                t = time.perf_counter()
                outs = eng.generate(input_ids=ids, sampling_params=sp)
                times.append(time.perf_counter() - t)
                after = eng.get_stats()
                assert all(o["meta_info"]["completion_tokens"] == NEW_TOKENS for o in outs)
                computed.append(after["prefill_tokens_computed"] - before["prefill_tokens_computed"])
                cached.append(sum(o["meta_info"]["cached_tokens"] for o in outs))
            res[name] = {"times": times, "computed": computed, "cached": cached,
                         "prompt_tokens": sum(len(x) for x in ids), "requests": len(ids),
                         "outputs": [o["output_ids"] for o in outs]}
    finally:
        eng.shutdown()
    out.put(res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--peers", default="", help="comma list of vllm, llamacpp: W3 on them too (see above)")
    ap.add_argument("--peers-dir", default=None, help="the peer scripts (default: ../shared/peers next to the repo)")
    ap.add_argument("--peer-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="vLLM-CPU's dtype: float32 is what it runs on a CPU without AVX512-BF16 (with "
                         "RADIXLANG_CPU_MASK=avx512_bf16 for ours: the second table)")
    args = ap.parse_args()
    peers = [p for p in args.peers.split(",") if p]
    if sorted(set(peers) - set(PEER_RUNS)):
        ap.error(f"unknown peer(s): choose from {sorted(PEER_RUNS)}")
    peers_dir = args.peers_dir or default_peers_dir()
    w3_ids = peer_workloads(peers_dir)["W3"]["ids"] if peers else None
    on, off = in_child(run_setting, False, args.runs, w3_ids), in_child(run_setting, True, args.runs, w3_ids)
    rows, summary = [], {}
    print(f"{'workload':10} {'cache':5} {'wall s (median)':>16} {'prefill computed':>17} {'hit rate':>9}  runs (s)")
    for name in on:
        for label, r in (("on", on[name]), ("off", off[name])):
            med = statistics.median(r["times"])
            hit = statistics.median(r["cached"]) / r["prompt_tokens"]
            print(f"{name:10} {label:5} {med:16.2f} {int(statistics.median(r['computed'])):17d} {hit:9.1%}  "
                  + "/".join(f"{t:.2f}" for t in r["times"]))
            rows.append({"workload": name, "cache": label, "wall_s": r["times"], "computed": r["computed"],
                         "cached": r["cached"], "prompt_tokens": r["prompt_tokens"]})
        speedup = statistics.median(off[name]["times"]) / statistics.median(on[name]["times"])
        same = sum(a == b for a, b in zip(on[name]["outputs"], off[name]["outputs"]))
        summary[name] = {"speedup": speedup, "same_greedy_outputs": same, "requests": on[name]["requests"]}
        print(f"{name:10} cache on is {speedup:.1f}x faster; greedy outputs identical on {same}/{on[name]['requests']}")
    if peers:
        from radixlang_runtime.model.loader.resolve import resolve_model_dir

        peer_rows = run_peers(peers, peers_dir, args.runs, resolve_model_dir(None), ("W3",), args.peer_dtype)
        ours = statistics.median(on["W3"]["times"])
        print(f"\nW3 on the peers' ids: radixlang cache on {ours:.2f} s, "
              f"off {statistics.median(off['W3']['times']):.2f} s")
        for row, r in peer_rows.items():
            if r.get("W3"):
                med = statistics.median(r["W3"])
                runs = "/".join(f"{t:.2f}" for t in r["W3"])
                print(f"  {row:34s} {med:8.2f} s ({runs})   radixlang (cache on) / this: {ours / med:.2f}x")
            else:
                print(f"  {row:34s} {r.get('error')}")
        summary["peers_W3_wall_s"] = {row: r.get("W3") for row, r in peer_rows.items()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
