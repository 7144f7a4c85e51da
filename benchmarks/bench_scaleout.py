"""Scale-out: data-parallel routing policies on a few-shot workload, and tensor-parallel decode steps.

DP: 4 few-shot prefixes (8 shared examples each, different examples per prefix) x 64 questions =
256 requests, shuffled, sent over HTTP by --concurrency closed-loop clients. Configurations: one
replica (the baseline), then dp_size 2 with each --load-balance-method. Per configuration one server,
--runs runs with the cache flushed before each; the table shows medians: prefill tokens computed,
cache hit rate (cached / prompt tokens, from /server_info), requests/s, and the prefill tokens each
replica computed.

TP: the in-process Engine with tp_size 1 and 2 (gloo, worker processes on this machine), float32,
one stream and a batch of 8 decoding --tp-tokens tokens: ms per decode step (median of --runs). On
a 2-core CPU the ranks share the same two cores, so TP=2 is about correctness here, not speed: its
steps pay all-reduces (2 per layer) over loopback and gain no compute.

    .venv/bin/python benchmarks/bench_scaleout.py
    .venv/bin/python benchmarks/bench_scaleout.py --questions 16 --runs 1 --skip-tp   # a smoke run
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import statistics
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SUBJECTS = ["capital", "currency", "language", "continent"]
COUNTRIES = ["France", "Germany", "Italy", "Spain", "Japan", "Egypt", "Canada", "Kenya", "Peru", "Chile", "Norway",
             "India", "Brazil", "Ghana", "Poland", "Vietnam", "Mexico", "Greece", "Nepal", "Cuba", "Iran", "Fiji",
             "Laos", "Mali", "Oman", "Chad", "China", "Korea", "Sweden", "Finland", "Ireland", "Portugal"]


def workload(questions_per_prefix: int, shots: int, seed: int = 0) -> list[tuple[int, str]]:
    """(prefix index, prompt) pairs, shuffled. Prefix k: `shots` examples about SUBJECTS[k]."""
    items = []
    for k, subject in enumerate(SUBJECTS):
        prefix = f"Answer with the {subject}.\n" + "".join(
            f"Q: What is the {subject} of {c}?\nA: (example {i} for {subject})\n"
            for i, c in enumerate(COUNTRIES[:shots]))
        for q in range(questions_per_prefix):
            country = COUNTRIES[(q * 7 + k) % len(COUNTRIES)]
            items.append((k, prefix + f"Q: What is the {subject} of {country} #{q}?\nA:"))
    random.Random(seed).shuffle(items)
    return items


def run_once(url: str, items: list[tuple[int, str]], concurrency: int, max_tokens: int) -> dict:
    httpx.post(url + "/flush_cache", timeout=60).raise_for_status()
    before = httpx.get(url + "/server_info", timeout=60).json()["stats"]
    body = {"sampling_params": {"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}

    def send(c: httpx.Client, text: str) -> None:
        r = c.post(url + "/generate", json={"text": text, **body})
        r.raise_for_status()

    t0 = time.perf_counter()
    with httpx.Client(timeout=600) as c, cf.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda it: send(c, it[1]), items))
    wall = time.perf_counter() - t0
    after = httpx.get(url + "/server_info", timeout=60).json()["stats"]
    replicas = after.get("replicas") or [after]
    replicas0 = before.get("replicas") or [before]
    per_rep = [r["prefill_tokens_computed"] - r0["prefill_tokens_computed"] for r, r0 in zip(replicas, replicas0)]
    computed = sum(per_rep)
    cached = after["prefill_tokens_cached"] - before["prefill_tokens_cached"]
    return {"wall_s": wall, "req_per_s": len(items) / wall, "computed": computed,
            "hit_rate": cached / max(1, cached + computed), "computed_per_replica": per_rep,
            "router": after.get("router")}


def bench_dp(args: argparse.Namespace) -> list[dict]:
    import radixlang as sgl

    items = workload(args.questions // len(SUBJECTS), args.shots)
    configs = [("dp1", {})] + [(f"dp2 {m}", {"dp_size": 2, "load_balance_method": m})
                               for m in ("cache_aware", "round_robin", "shortest_queue")]
    rows = []
    for name, extra in configs:
        with sgl.Runtime(dtype=args.dtype, max_total_tokens=args.max_total_tokens, **extra) as rt:
            runs = [run_once(rt.url, items, args.concurrency, args.max_tokens) for _ in range(args.runs)]
        med = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "req_per_s", "computed", "hit_rate")}
        rows.append({"config": name, **med, "computed_per_replica": runs[-1]["computed_per_replica"],
                     "router": runs[-1]["router"]})
        print(f"{name:22s} computed {med['computed']:8.0f}  hit {med['hit_rate']:.3f}  "
              f"{med['req_per_s']:6.2f} req/s  per replica {runs[-1]['computed_per_replica']}", flush=True)
    return rows


def bench_tp(args: argparse.Namespace) -> list[dict]:
    from radixlang_runtime import Engine

    rows = []
    for tp in (1, 2):
        eng = Engine(dtype="float32", tp_size=tp, max_total_tokens=8192)
        try:
            for batch in (1, 8):
                prompts = [f"Story {i}: once upon a time" for i in range(batch)]
                sp = {"max_new_tokens": args.tp_tokens, "ignore_eos": True, "temperature": 0}
                eng.generate(prompts, {**sp, "max_new_tokens": 4})  # warm-up
                times = []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    eng.generate(prompts, sp)
                    times.append((time.perf_counter() - t0) / args.tp_tokens * 1000)
                rows.append({"tp_size": tp, "batch": batch, "ms_per_step": statistics.median(times)})
                print(f"tp {tp} batch {batch}: {rows[-1]['ms_per_step']:.1f} ms per decode step", flush=True)
        finally:
            eng.shutdown()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", type=int, default=256)
    p.add_argument("--shots", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-total-tokens", type=int, default=32768)
    p.add_argument("--tp-tokens", type=int, default=32)
    p.add_argument("--skip-tp", action="store_true")
    p.add_argument("--skip-dp", action="store_true")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    out = {"dp": [] if args.skip_dp else bench_dp(args), "tp": [] if args.skip_tp else bench_tp(args)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
