"""Hierarchical KV cache (--enable-hierarchical-cache): what the tiers under the radix tree buy, measured against
two criteria (the default run, about 10 minutes on an idle 2-core CPU with the embedded model).

Agent (criterion: hit rate >= 0.9 of a roomy pool's, throughput >= 2x the same pool without tiers, medians of 3):
S sessions x T turns over one shared system prompt (greedy, EOS ignored); a turn's prompt = system + the
session's whole history (its earlier user messages and replies) + a new user message; each turn round submits
every session's next turn together. Settings, each in its own child process: the pool sized to a quarter of
the working set without tiers, the same pool with L2 (a temp disk directory), and a roomy pool. Reported: wall
time (median of --runs; throughput ratio = the no-tiers wall / the L2 wall, same work), prompt tokens computed,
hit rate (prompt tokens not computed / all). The full workload is 64 sessions x 8 turns over 2,000 tokens;
this script runs 12 sessions x 8 turns (64-token user messages, 16-token replies) over 2,000 tokens: 3/16 as
many sessions, so that the no-tiers setting (which recomputes every history every turn) fits the time. The
pool is a quarter of the working set or, when that is larger, the system prompt plus one whole session (+64):
here 2,704 tokens, 0.28 of 9,680. --sessions / --turns change the workload (the time grows with sessions x
turns^2 without tiers); `--part agent --sessions 64` is the full workload itself (figures and timing:
docs/PERFORMANCE.md; the quarter pool batches ~13 sessions' decode there, at 12 sessions one or two).
Restart (criterion: a 4,000-token system prompt's TTFT after a restart >= 10x faster than cold, from L2 and from
L3 each): TTFT (max_new_tokens 1, after a 16-token warm-up) of a fresh Engine without tiers (cold, the prompt
flushed between repetitions), then a fresh Engine per repetition finding the prompt on L2 only, and on L3 only
(a redis-server this script starts; skipped without one); medians of --runs. Not scaled down.
Swap (retract_decode; not part of the default run): R requests decoding together in a pool too small for their
outputs (an optimistic decode reservation admits them all), so decode retracts; without tiers a readmission
recomputes what L1 lost, with L2 the retracted request's records were swapped out and come back. Reported: wall
time, tokens recomputed / swapped in / kept at readmission, retractions.

    python benchmarks/bench_hicache.py               # agent + restart (the criteria), medians of 3
    python benchmarks/bench_hicache.py --quick       # 4 x 2 over 256 tokens, restart 512, 1 run (a smoke check)
    python benchmarks/bench_hicache.py --part swap [--quick]     # --part all: agent, restart and swap
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

FULL = dict(sessions=12, turns=8, system_len=2000, user_len=64, new_tokens=16, restart_len=4000, runs=3,
            swap_reqs=16, swap_prompt=512, swap_new=256)
QUICK = dict(sessions=4, turns=2, system_len=256, user_len=32, new_tokens=4, restart_len=512, runs=1,
             swap_reqs=8, swap_prompt=64, swap_new=128)
FULL_WORKLOAD = "the full workload: 64 sessions x 8 turns over a 2,000-token system prompt"


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
            assert eng.flush_cache()  # every tier: each run starts cold
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
    q.put({"wall": statistics.median(walls), "walls": walls, "computed": computed // work["runs"],
           "hit_rate": 1 - computed / prompt_tokens, "tier_hits": hc["hit_tokens"] if hc else None})


def run_ttft(settings: dict, work: dict, reps: int, q) -> None:
    """TTFT of the restart prompt on a fresh Engine, reps times (flushed between: only for the cold setting)."""
    from radixlang_runtime import Engine

    system, _ = make_workload(1, work["restart_len"], 1, seed=1)
    out = {"ttft": [], "cached": [], "load_s": 0.0}
    with Engine(dtype=work["dtype"], **settings) as eng:
        # first-call costs (thread pools, the pool's first pages) are not the prefix's: a short unrelated warm-up
        eng.generate(input_ids=list(range(50, 66)), sampling_params={"max_new_tokens": 1, "temperature": 0})
        for i in range(reps):
            if i:
                assert eng.flush_cache()
            t0 = time.perf_counter()
            r = eng.generate(input_ids=system, sampling_params={"max_new_tokens": 1, "temperature": 0})
            out["ttft"].append(time.perf_counter() - t0)
            out["cached"].append(r["meta_info"]["cached_tokens"])
        hc = eng.get_stats()["hicache"]
        out["load_s"] = hc["load_seconds"] if hc else 0.0
    q.put(out)  # the Engine's shutdown (above) stored the prompt on its tiers


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
    ap.add_argument("--sessions", type=int, default=None)
    ap.add_argument("--turns", type=int, default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--part", choices=("criteria", "all", "agent", "restart", "swap"), default="criteria")
    a = ap.parse_args()
    work = dict(QUICK if a.quick else FULL, dtype=a.dtype)
    for name in ("runs", "sessions", "turns"):
        if getattr(a, name):
            work[name] = getattr(a, name)
    began = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="bench_hicache_")
    print(f"workload: {work}\n  ({FULL_WORKLOAD}; this run: {work['sessions']} sessions x {work['turns']} turns over "
          f"{work['system_len']} tokens, restart prompt {work['restart_len']} tokens, medians of {work['runs']})",
          flush=True)
    try:
        verdicts = []
        if a.part in ("criteria", "all", "restart"):
            verdicts += restart(tmp, work)
        if a.part in ("criteria", "all", "agent"):
            verdicts += agent(tmp, work)
        if a.part in ("all", "swap"):
            swap(tmp, work)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if verdicts:
        print("\ncriteria (this run):")
        for line in verdicts:
            print("  " + line)
    print(f"total {time.perf_counter() - began:.0f} s", flush=True)


def verdict(name: str, value: float, floor: float, unit: str = "x") -> str:
    return f"{name}: {value:.2f}{unit} (criterion >= {floor}{unit}: {'met' if value >= floor else 'NOT met'})"


def agent(tmp: str, work: dict) -> list[str]:
    per_session = work["turns"] * (work["user_len"] + work["new_tokens"])
    working_set = work["system_len"] + work["sessions"] * per_session
    small = max(working_set // 4, work["system_len"] + per_session + 64) // 16 * 16
    rows = {
        "small pool, no tiers": {"max_total_tokens": small},
        "small pool + L2": {"max_total_tokens": small, "enable_hierarchical_cache": True, "hicache_size": 2.0,
                            "hicache_storage_dir": os.path.join(tmp, "agent_l2")},
        "roomy pool": {"max_total_tokens": 4 * working_set // 16 * 16},
    }
    print(f"\nagent: working set ~{working_set} tokens, small pool {small} ({small / working_set:.2f} of it)")
    print(f"{'setting':24} {'wall s':>8} {'x vs no tiers':>14} {'computed':>9} {'hit rate':>9}  walls; tier hits",
          flush=True)
    res = {}
    for name, settings in rows.items():
        r = res[name] = in_child(run_agent, settings, work)
        base = res["small pool, no tiers"]["wall"]
        print(f"{name:24} {r['wall']:8.2f} {base / r['wall']:14.2f} {r['computed']:9d} {r['hit_rate']:9.3f}  "
              f"{[round(w, 1) for w in r['walls']]}; {r['tier_hits']}", flush=True)
    tiers, roomy = res["small pool + L2"], res["roomy pool"]
    return [verdict("agent throughput, small pool + L2 / the same pool without tiers",
                    res["small pool, no tiers"]["wall"] / tiers["wall"], 2),
            verdict("agent hit rate, small pool + L2 / roomy pool", tiers["hit_rate"] / roomy["hit_rate"], 0.9, "")]


def ttft_children(settings: dict, work: dict) -> dict:
    """One fresh Engine per repetition (a restart each): the median TTFT, every TTFT, the cached tokens."""
    rs = [in_child(run_ttft, settings, work, 1) for _ in range(work["runs"])]
    ttfts = [r["ttft"][0] for r in rs]
    return {"ttft": statistics.median(ttfts), "all": ttfts, "cached": [r["cached"][0] for r in rs],
            "load_s": statistics.median(r["load_s"] for r in rs)}


def restart(tmp: str, work: dict) -> list[str]:
    n = work["restart_len"]
    secret = "bench-hicache deployment secret"  # L3 needs one, and L2 then reads what the L2 + L3 run sealed with it
    l2 = {"enable_hierarchical_cache": True, "hicache_size": 2.0, "hicache_storage_dir": os.path.join(tmp, "r_l2"),
          "hicache_secret": secret}
    c = in_child(run_ttft, {}, work, work["runs"])
    cold = statistics.median(c["ttft"])
    print(f"\nrestart TTFT, {n}-token prompt (medians of {work['runs']}):\n  cold {cold:.3f} s "
          f"{[round(t, 3) for t in c['ttft']]}", flush=True)
    srv, url = start_redis(tmp)
    try:
        l3 = {"enable_hierarchical_cache": True, "hicache_size": 0, "hicache_storage_backend": "redis",
              "hicache_redis_url": url, "hicache_secret": secret}
        both = dict(l2, hicache_storage_backend="redis", hicache_redis_url=url, hicache_secret=secret) \
            if srv is not None else l2
        in_child(run_ttft, both, work, 1)  # computes the prompt; its shutdown stores it on L2 (and L3)
        out = []
        for name, settings in (("L2", l2), ("L3", l3)):
            if name == "L3" and srv is None:
                print("  L3: skipped (no redis-server)", flush=True)
                continue
            w = ttft_children(settings, work)
            print(f"  {name} {w['ttft']:.3f} s {[round(t, 3) for t in w['all']]} ({cold / w['ttft']:.1f}x; cached "
                  f"{w['cached']} of {n}; {w['load_s']:.3f} s loading)", flush=True)
            out.append(verdict(f"restart TTFT from {name}, cold / {name}", cold / w["ttft"], 10))
        return out
    finally:
        if srv is not None:
            srv.stop()


if __name__ == "__main__":
    main()
