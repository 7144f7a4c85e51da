"""Prefill-decode disaggregation vs one co-located server: decode inter-token latency while long prompts arrive.

Systems, one after the other on the same machine (each started fresh, the others stopped):
- colo: one co-located server using every core;
- pd:   one prefill server pinned to the first half of the cores and one decode server pinned to the other half
        (taskset, OMP_NUM_THREADS = its cores), behind `launch_router --pd-disaggregation`.
Workload per run, on each system: --streams requests stream --stream-tokens tokens each (native /generate,
greedy, EOS ignored): their inter-token latencies (ITL) are measured once with nothing else arriving, and
once while --long-tokens-token prompts (random ids, no cache hits) arrive every --arrival-interval s
(--long-max-tokens output tokens each) for as long as the streams run, --max-arrivals at most (a server that
prefills first would otherwise starve the streams for good once arrivals outpace its prefill).
Reported, medians of --runs runs: ITL p50 / p99 / max of the streams (no arrivals, arrivals), the p99 ratio
arrivals / no arrivals (under PD it stays within 1.5x), how many long prompts got their first token
while the streams ran (overlap: the events the streams could see; p99 sees a stall only when stalled ITLs are
>= 1% of the samples, max sees any), TTFT p50 / p99 of the long prompts, output tokens/s and long prompts/s of
the arrivals phase. Defaults: 4 streams of 1,024 tokens (~20 s), 2,000-token prompts every 2 s, 8 at most:
long enough that a one-core prefill server finishes several prompts while the streams decode.
The embedded model (SmolLM2-135M) unless --model-path.

    .venv/bin/python benchmarks/bench_pd.py                     # colo and pd, 3 runs
    .venv/bin/python benchmarks/bench_pd.py --quick             # a smoke run: small sizes, 1 run
    .venv/bin/python benchmarks/bench_pd.py --systems colo      # one system only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_common import Proc, free_port, percentile  # noqa: E402
from bench_serving import one_request  # noqa: E402



def server_cmd(port: int, args: argparse.Namespace, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "radixlang_runtime.launch_server", "--port", str(port), "--dtype", args.dtype]
    if args.model_path:
        cmd += ["--model-path", args.model_path]
    return cmd + list(extra) + args.server_flags.split()


def start_system(name: str, args: argparse.Namespace) -> tuple[str, list[Proc]]:
    """(the URL clients use, the processes to stop). Servers start together, then the router."""
    cores = list(range(os.cpu_count() or 2))
    procs: list[Proc] = []
    try:
        if name == "colo":
            port = free_port()
            procs.append(Proc("colo", server_cmd(port, args), port))
        else:
            half = max(1, len(cores) // 2)
            pp, dp, bp, rp = free_port(), free_port(), free_port(), free_port()
            procs.append(Proc("prefill", server_cmd(pp, args, "--disaggregation-mode", "prefill",
                                                    "--disaggregation-bootstrap-port", str(bp)), pp, cores[:half]))
            procs.append(Proc("decode", server_cmd(dp, args, "--disaggregation-mode", "decode"), dp,
                              cores[half:] or cores[:half]))
            for p in procs:
                p.up(args.start_timeout)
            router = [sys.executable, "-m", "radixlang_runtime.launch_router", "--pd-disaggregation", "--port", str(rp),
                      "--prefill", procs[0].url, str(bp), "--decode", procs[1].url]
            procs.append(Proc("router", router, rp))
        for p in procs:
            p.up(args.start_timeout)
        return procs[-1].url, procs
    except BaseException:
        for p in procs:
            p.stop()
        raise


def rand_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 30000) for _ in range(n)]


async def phase(url: str, args: argparse.Namespace, arrivals: bool, seed: int) -> dict:
    """--streams streams; with arrivals, long prompts every --arrival-interval s while they run."""
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=args.request_timeout, limits=limits) as client:
        t0 = time.perf_counter()
        streams = [asyncio.create_task(one_request(client, "native", "", rand_ids(rng, args.stream_prompt_tokens),
                                                   args.stream_tokens)) for _ in range(args.streams)]
        longs: list[asyncio.Task] = []
        sent: list[float] = []  # when each long prompt was sent, seconds after t0
        if arrivals:
            await asyncio.sleep(args.arrival_interval / 2)
            while not all(s.done() for s in streams) and len(longs) < args.max_arrivals:
                sent.append(time.perf_counter() - t0)
                longs.append(asyncio.create_task(one_request(client, "native", "", rand_ids(rng, args.long_tokens),
                                                             args.long_max_tokens)))
                await asyncio.wait(streams, timeout=args.arrival_interval)
        s_res = await asyncio.gather(*streams)
        l_res = await asyncio.gather(*longs)
        wall = time.perf_counter() - t0
    failed = [r.error for r in s_res + l_res if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, e.g. {failed[0]}")
    itl = [x for r in s_res for x in r.itl]
    ttft = [r.ttft for r in l_res]
    streams_end = max(r.e2e for r in s_res)  # the streams all start at t0
    # long prompts whose prefill (and, under PD, KV transfer) finished while the streams were decoding: the
    # events the streams' ITL can see (ITL p99 only sees them when they are >= 1% of the ITL samples)
    overlap = sum(at + r.ttft < streams_end for at, r in zip(sent, l_res))
    out_tokens = sum(r.output_tokens for r in s_res + l_res)
    return {"itl_p50_ms": percentile(itl, 0.5) * 1e3, "itl_p99_ms": percentile(itl, 0.99) * 1e3,
            "itl_max_ms": max(itl) * 1e3, "overlap": overlap,
            "long_ttft_p50_ms": percentile(ttft, 0.5) * 1e3, "long_ttft_p99_ms": percentile(ttft, 0.99) * 1e3,
            "long_prompts": len(l_res), "out_tok_per_s": out_tokens / wall, "long_per_s": len(l_res) / wall,
            "wall_s": wall}


def bench_system(name: str, args: argparse.Namespace) -> dict:
    url, procs = start_system(name, args)
    try:
        asyncio.run(phase(url, _warm(args), False, 99))
        runs = []
        for i in range(args.runs):
            quiet = asyncio.run(phase(url, args, False, 2 * i))
            busy = asyncio.run(phase(url, args, True, 2 * i + 1))
            ratio = busy["itl_p99_ms"] / max(quiet["itl_p99_ms"], 1e-9)
            runs.append({"quiet": quiet, "busy": busy, "ratio_p99": ratio})
            print(f"  {name} run {i}: ITL p99 {quiet['itl_p99_ms']:.1f} -> {busy['itl_p99_ms']:.1f} ms "
                  f"(x{runs[-1]['ratio_p99']:.2f}), long TTFT p50 {busy['long_ttft_p50_ms']:.0f} ms "
                  f"({busy['long_prompts']} long prompts, {busy['overlap']} done while the streams ran; "
                  f"ITL max {quiet['itl_max_ms']:.0f} -> {busy['itl_max_ms']:.0f} ms)", flush=True)
    finally:
        for p in reversed(procs):
            p.stop()
    med = lambda f: statistics.median(f(r) for r in runs)  # noqa: E731
    row = {"system": name, "runs": runs, "ratio_p99": med(lambda r: r["ratio_p99"])}
    for part in ("quiet", "busy"):
        for key in runs[0][part]:
            row[f"{part}_{key}"] = med(lambda r: r[part][key])
    return row


def _warm(args: argparse.Namespace) -> argparse.Namespace:
    """The warm-up phase's sizes: one short stream (kernels built, caches warm)."""
    return argparse.Namespace(**{**vars(args), "streams": 1, "stream_tokens": 4})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default="colo,pd", help="comma-separated: colo, pd")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--stream-prompt-tokens", type=int, default=32)
    p.add_argument("--stream-tokens", type=int, default=1024)
    p.add_argument("--long-tokens", type=int, default=2000)
    p.add_argument("--long-max-tokens", type=int, default=4)
    p.add_argument("--arrival-interval", type=float, default=2.0, help="seconds between long prompts")
    p.add_argument("--max-arrivals", type=int, default=8, help="long prompts per run at most (a bounded queue)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--model-path", default=None, help="default: the embedded model")
    p.add_argument("--server-flags", default="", help="extra launch_server flags for every server")
    p.add_argument("--start-timeout", type=float, default=900.0)
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 2 streams of 96 tokens, at most 3 prompts of 512 tokens every 0.5 s, 1 run")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if args.quick:
        args.runs, args.streams, args.stream_tokens, args.long_tokens = 1, 2, 96, 512
        args.arrival_interval, args.max_arrivals = 0.5, 3
    systems = [s for s in args.systems.split(",") if s]
    bad = [s for s in systems if s not in ("colo", "pd")]
    if bad:
        p.error(f"unknown system(s) {bad}; expected colo, pd")
    rows = []
    for name in systems:
        print(f"{name}: starting", flush=True)
        rows.append(bench_system(name, args))
    print(f"\n{'system':6} {'ITL p50':>8} {'ITL p99':>8} {'ITL max':>8} | {'ITL p50':>8} {'ITL p99':>8} "
          f"{'ITL max':>8} {'p99 x':>6} {'overlap':>7} | {'TTFT p50':>9} {'TTFT p99':>9} {'tok/s':>7} {'long/s':>7}")
    print(f"{'':6} {'no arrivals (ms)':>26} | {'long prompts arriving (ms)':>33} {'':>14} | {'long prompts (ms)':>19}")
    for r in rows:
        print(f"{r['system']:6} {r['quiet_itl_p50_ms']:8.1f} {r['quiet_itl_p99_ms']:8.1f} "
              f"{r['quiet_itl_max_ms']:8.0f} | "
              f"{r['busy_itl_p50_ms']:8.1f} {r['busy_itl_p99_ms']:8.1f} {r['busy_itl_max_ms']:8.0f} "
              f"{r['ratio_p99']:6.2f} {r['busy_overlap']:7.0f} | "
              f"{r['busy_long_ttft_p50_ms']:9.0f} {r['busy_long_ttft_p99_ms']:9.0f} "
              f"{r['busy_out_tok_per_s']:7.1f} {r['busy_long_per_s']:7.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
