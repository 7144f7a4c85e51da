"""Hierarchical KV cache (--enable-hierarchical-cache): what the tiers under the radix tree buy.

Multi-turn agent workload (greedy, EOS ignored): S sessions x T turns over one shared system prompt; a
turn's prompt = system + the session's whole history (its earlier user messages and replies) + a new
user message; each turn round submits every session's next turn together. Settings, each in its own
child process: the pool sized to a quarter of the working set without tiers, the same pool with L2
(a temp disk directory), and a roomy pool. Reported: wall time (median of --runs), prompt tokens
computed, hit rate (prompt tokens not computed / all).
Swap (retract_decode): R requests decoding together in a pool too small for their outputs (an optimistic
decode reservation admits them all), so decode retracts; without tiers a readmission recomputes what L1
lost, with L2 the retracted request's records were swapped out and come back. Reported: wall time, tokens
recomputed / swapped in / kept at readmission, retractions.
Restart: one long system prompt's TTFT (max_new_tokens 1) on a fresh Engine: cold (empty tiers), after
a restart with the prefix on L2, and from L3 (a redis-server this script starts; skipped without one).

    python benchmarks/bench_hicache.py            # 16 sessions x 6 turns, 2,000-token system prompt, 3 runs
    python benchmarks/bench_hicache.py --quick    # 4 x 2, 256 tokens, 1 run (a smoke check)
    python benchmarks/bench_hicache.py --part swap [--quick]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

from bench_common import in_child

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))


def make_workload(sessions: int, system_len: int, user_len: int, seed: int = 0):
    rng = random.Random(seed)
    system = [rng.randrange(100, 40000) for _ in range(system_len)]
    users = [[[rng.randrange(100, 40000) for _ in range(user_len)] for _ in range(64)] for _ in range(sessions)]
    return system, users


def run_agent(settings: dict, work: dict, q) -> None:
    from radixlang_runtime import Engine

    system, users = make_workload(work["sessions"], work["system_len"], work["user_len"])
    new = work["new_tokens"]
    sp = {"max_new_tokens": new, "min_new_tokens": new, "temperature": 0, "ignore_eos": True}
    walls, computed, prompt_tokens = [], 0, 0
    with Engine(dtype=work["dtype"], **settings) as eng:
        for _ in range(work["runs"]):
            eng.flush_cache()  # every tier: each run starts cold
            history = [list(system) for _ in users]
            before = eng.get_stats()["prefill_tokens_computed"]
            t0 = time.perf_counter()
            for turn in range(work["turns"]):
                prompts = [h + users[s][turn] for s, h in enumerate(history)]
                outs = eng.generate(input_ids=prompts, sampling_params=sp)
                for s, o in enumerate(outs):
                    history[s] = prompts[s] + o["output_ids"]
                prompt_tokens += sum(map(len, prompts))
            walls.append(time.perf_counter() - t0)
            computed += eng.get_stats()["prefill_tokens_computed"] - before
        hc = eng.get_stats()["hicache"]
    q.put({"wall": statistics.median(walls), "computed": computed // work["runs"],
           "hit_rate": 1 - computed / prompt_tokens, "tier_hits": hc["hit_tokens"] if hc else None})


def run_ttft(settings: dict, work: dict, q) -> None:
    from radixlang_runtime import Engine

    system, _ = make_workload(1, work["restart_len"], 1, seed=1)
    with Engine(dtype=work["dtype"], **settings) as eng:
        # first-call costs (thread pools, the pool's first pages) are not the prefix's: a short unrelated warm-up
        eng.generate(input_ids=list(range(50, 66)), sampling_params={"max_new_tokens": 1, "temperature": 0})
        t0 = time.perf_counter()
        out = eng.generate(input_ids=system, sampling_params={"max_new_tokens": 1, "temperature": 0})
        ttft = time.perf_counter() - t0
        hc = eng.get_stats()["hicache"]
        q.put({"ttft": ttft, "cached": out["meta_info"]["cached_tokens"],
               "load_s": hc["load_seconds"] if hc else 0.0})


def run_swap(settings: dict, work: dict, q) -> None:
    from radixlang_runtime import Engine

    rng = random.Random(2)
    prompts = [[rng.randrange(100, 40000) for _ in range(work["swap_prompt"])] for _ in range(work["swap_reqs"])]
    sp = {"max_new_tokens": work["swap_new"], "min_new_tokens": work["swap_new"], "temperature": 0,
          "ignore_eos": True}
    with Engine(dtype=work["dtype"], new_token_ratio_init=0.05, new_token_ratio_min=0.05, **settings) as eng:
        t0 = time.perf_counter()
        outs = eng.generate(input_ids=prompts, sampling_params=[sp] * len(prompts))
        wall = time.perf_counter() - t0
        st = eng.get_stats()
    q.put({"wall": wall, "retractions": st["num_retractions"], "readmit": st["readmit_tokens"],
           "outputs": [o["output_ids"] for o in outs]})


def swap(tmp: str, work: dict) -> None:
    pool = work["swap_reqs"] * (work["swap_prompt"] + work["swap_new"]) // 3 // 16 * 16  # a third of what decode needs
    rows = {"no tiers": {"max_total_tokens": pool},
            "L2 (swap)": {"max_total_tokens": pool, "enable_hierarchical_cache": True, "hicache_size": 2.0,
                          "hicache_storage_dir": os.path.join(tmp, "swap_l2")}}
    print(f"swap: {work['swap_reqs']} requests x ({work['swap_prompt']} + {work['swap_new']}) tokens, pool {pool}",
          flush=True)
    base = None
    for name, settings in rows.items():
        r = in_child(run_swap, settings, work)
        same = "" if base is None else f", outputs {'identical' if r['outputs'] == base['outputs'] else 'DIFFER'}"
        base = base or r
        print(f"  {name:10} wall {r['wall']:7.2f} s ({base['wall'] / r['wall']:.2f}x), {r['retractions']} retractions, "
              f"readmission tokens {r['readmit']}{same}", flush=True)


def start_redis(directory: str):
    exe = shutil.which("redis-server")
    if exe is None:
        return None, None
    from redis_utils import RedisServer

    srv = RedisServer(directory)
    return srv, srv.url


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--part", choices=("all", "agent", "restart", "swap"), default="all")
    a = ap.parse_args()
    work = dict(sessions=4, turns=2, system_len=256, user_len=32, new_tokens=4, restart_len=512, runs=1,
                swap_reqs=8, swap_prompt=64, swap_new=128) \
        if a.quick else dict(sessions=16, turns=6, system_len=2000, user_len=64, new_tokens=16, restart_len=4000,
                             runs=3, swap_reqs=16, swap_prompt=512, swap_new=256)
    work["dtype"] = a.dtype
    if a.runs:
        work["runs"] = a.runs
    per_session = work["turns"] * (work["user_len"] + work["new_tokens"])
    working_set = work["system_len"] + work["sessions"] * per_session
    small = max(working_set // 4, work["system_len"] + 2 * per_session + 64) // 16 * 16
    tmp = tempfile.mkdtemp(prefix="bench_hicache_")
    print(f"workload: {work}; working set ~{working_set} tokens, small pool {small}", flush=True)
    rows = {
        "small pool, no tiers": {"max_total_tokens": small},
        "small pool + L2": {"max_total_tokens": small, "enable_hierarchical_cache": True, "hicache_size": 2.0,
                            "hicache_storage_dir": os.path.join(tmp, "agent_l2")},
        "roomy pool": {"max_total_tokens": 4 * working_set // 16 * 16},
    }
    if a.part in ("all", "agent"):
        agent(rows, work)
    if a.part in ("all", "restart"):
        restart(tmp, work)
    if a.part in ("all", "swap"):
        swap(tmp, work)
    shutil.rmtree(tmp, ignore_errors=True)


def agent(rows: dict, work: dict) -> None:
    print(f"{'setting':24} {'wall s':>8} {'x vs no tiers':>14} {'computed':>9} {'hit rate':>9}  tier hits", flush=True)
    base = None
    for name, settings in rows.items():
        r = in_child(run_agent, settings, work)
        base = base or r["wall"]
        print(f"{name:24} {r['wall']:8.2f} {base / r['wall']:14.2f} {r['computed']:9d} {r['hit_rate']:9.3f}  "
              f"{r['tier_hits']}", flush=True)


def restart(tmp: str, work: dict) -> None:
    l2 = {"enable_hierarchical_cache": True, "hicache_size": 2.0, "hicache_storage_dir": os.path.join(tmp, "r_l2")}
    cold = in_child(run_ttft, {}, work)
    in_child(run_ttft, l2, work)  # computes the prefix; its shutdown stores it on L2
    warm_l2 = in_child(run_ttft, l2, work)
    print(f"restart TTFT, {work['restart_len']}-token prompt: cold {cold['ttft']:.3f} s; "
          f"L2 {warm_l2['ttft']:.3f} s ({cold['ttft'] / warm_l2['ttft']:.1f}x, {warm_l2['cached']} cached, "
          f"{warm_l2['load_s']:.3f} s loading)",
          flush=True)
    srv, url = start_redis(tmp)
    if srv is not None:
        try:
            l3 = {"enable_hierarchical_cache": True, "hicache_size": 0, "hicache_storage_backend": "redis",
                  "hicache_redis_url": url}
            in_child(run_ttft, l3, work)
            warm_l3 = in_child(run_ttft, l3, work)
            print(f"  L3 {warm_l3['ttft']:.3f} s ({cold['ttft'] / warm_l3['ttft']:.1f}x, {warm_l3['cached']} cached, "
                  f"{warm_l3['load_s']:.3f} s loading)")
        finally:
            srv.stop()
    else:
        print("  L3: skipped (no redis-server)")


if __name__ == "__main__":
    main()
