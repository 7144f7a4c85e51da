"""Online serving benchmark: Poisson arrivals against an HTTP server (ours or any OpenAI-compatible one).

Each request streams; per request we record TTFT (send -> first token), inter-token latencies
(gaps between streamed tokens) and TPOT ((e2e - TTFT) / (output tokens - 1)). Reported per request
rate: request and output-token throughput, TTFT / TPOT / ITL p50 and p99, as a table and JSON.
Prompts are random token ids (the same for every rate and backend), outputs a fixed length with EOS
ignored, so systems do the same work.

    python benchmarks/bench_serving.py                                  # starts our server, rates 1, 4, inf
    python benchmarks/bench_serving.py --base-url http://host:8000 --backend openai --model NAME
    python benchmarks/bench_serving.py --compare-engine                 # + HTTP overhead vs the in-process Engine

--compare-engine runs the rate=inf workload through the in-process Engine as well (its own child
process, same server arguments) and prints the HTTP path's throughput as a share of the Engine's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

import httpx

from bench_common import in_child, percentile


@dataclass
class Result:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    error: str = ""


def make_prompts(n: int, input_len: int, ratio: float, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lo = max(1, int(input_len * ratio))
    return [[rng.randrange(100, 30000) for _ in range(rng.randint(lo, input_len))] for _ in range(n)]


def _events(lines: list[str]):
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


async def one_request(client: httpx.AsyncClient, backend: str, model: str, ids: list[int], out_len: int) -> Result:
    if backend == "native":
        url, body = "/generate", {"input_ids": ids, "stream": True,
                                  "sampling_params": {"max_new_tokens": out_len, "ignore_eos": True, "temperature": 0}}
    else:
        url, body = "/v1/completions", {"model": model, "prompt": ids, "max_tokens": out_len, "temperature": 0,
                                        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    stamps: list[tuple[float, int]] = []  # (time, tokens received so far)
    seen = 0
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                return Result(False, error=f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                now = time.perf_counter()
                if "error" in ev:
                    return Result(False, error=str(ev["error"]))
                if backend == "native":
                    n = len(ev["output_ids"])
                elif ev.get("usage") and not ev.get("choices"):
                    n = ev["usage"]["completion_tokens"]
                    if stamps:
                        stamps[-1] = (stamps[-1][0], n)  # usage gives the exact count at the end
                    continue
                else:
                    n = seen + (1 if ev["choices"] and ev["choices"][0].get("text") else 0)
                if n > seen:
                    stamps.append((now, n))
                    seen = n
    except httpx.HTTPError as e:
        return Result(False, error=repr(e))
    if not stamps:
        return Result(False, error="no tokens")
    end = stamps[-1][0]
    itl = []
    for (ta, na), (tb, nb) in zip(stamps, stamps[1:]):
        itl += [(tb - ta) / (nb - na)] * (nb - na)
    return Result(True, stamps[0][0] - t0, end - t0, itl, stamps[-1][1])


async def run_rate(base_url: str, backend: str, model: str, prompts: list[list[int]], out_len: int,
                   rate: float, seed: int = 0) -> dict:
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=len(prompts) + 8, max_keepalive_connections=len(prompts) + 8)
    async with httpx.AsyncClient(base_url=base_url, timeout=3600, limits=limits) as client:
        tasks = []
        t0 = time.perf_counter()
        for ids in prompts:
            tasks.append(asyncio.create_task(one_request(client, backend, model, ids, out_len)))
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    ok = [r for r in results if r.ok]
    if not ok:
        raise RuntimeError(f"every request failed, e.g. {results[0].error}")
    pct = lambda xs, q: percentile(xs, q) * 1e3  # noqa: E731
    ttft = [r.ttft for r in ok]
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itl = [x for r in ok for x in r.itl]
    out_tokens = sum(r.output_tokens for r in ok)
    return {"rate": rate, "completed": len(ok), "failed": len(results) - len(ok), "wall_s": wall,
            "req_per_s": len(ok) / wall, "out_tok_per_s": out_tokens / wall,
            "ttft_p50_ms": pct(ttft, 0.5), "ttft_p99_ms": pct(ttft, 0.99),
            "tpot_p50_ms": pct(tpot, 0.5), "tpot_p99_ms": pct(tpot, 0.99),
            "itl_p50_ms": pct(itl, 0.5), "itl_p99_ms": pct(itl, 0.99)}


def engine_throughput(server_flags: dict, prompts: list[list[int]], out_len: int, runs: int, out: mp.Queue) -> None:
    from radixlang_runtime import Engine

    with Engine(**server_flags) as eng:
        sp = {"max_new_tokens": out_len, "ignore_eos": True, "temperature": 0}
        eng.generate(input_ids=prompts[0], sampling_params={"max_new_tokens": 4})
        rates = []
        for _ in range(runs):
            assert eng.flush_cache()
            t = time.perf_counter()
            outs = eng.generate(input_ids=prompts, sampling_params=sp)
            rates.append(sum(o["meta_info"]["completion_tokens"] for o in outs) / (time.perf_counter() - t))
    out.put(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="a running server; default: start ours on a free port")
    ap.add_argument("--backend", choices=("native", "openai"), default="native")
    ap.add_argument("--model", default="default")
    ap.add_argument("--request-rates", default="1,4,inf")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--random-range-ratio", type=float, default=1.0, help="input lengths in [ratio*len, len]")
    ap.add_argument("--compare-engine", action="store_true")
    ap.add_argument("--runs", type=int, default=3, help="repeats of the rate=inf run for --compare-engine")
    ap.add_argument("--json")
    args = ap.parse_args()
    prompts = make_prompts(args.num_prompts, args.input_len, args.random_range_ratio)
    rates = [float(x) for x in args.request_rates.split(",")]
    server = None
    base_url = args.base_url
    if base_url is None:
        sys.path.insert(0, "tests")
        from server_utils import ServerProcess

        server = ServerProcess()
        base_url = server.url
    rows = []
    try:
        for rate in rates:
            if server is not None:
                httpx.post(base_url + "/flush_cache", timeout=60)
            rows.append(asyncio.run(run_rate(base_url, args.backend, args.model, prompts, args.output_len, rate)))
        http_inf = []
        if args.compare_engine:
            for _ in range(args.runs):
                httpx.post(base_url + "/flush_cache", timeout=60)
                http_inf.append(asyncio.run(run_rate(base_url, args.backend, args.model, prompts, args.output_len,
                                                     float("inf")))["out_tok_per_s"])
    finally:
        if server is not None:
            server.stop()
    print(f"{'rate':>6} {'done':>5} {'req/s':>7} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} "
          f"{'TPOT p99':>9} {'ITL p50':>8} {'ITL p99':>8}   (ms)")
    for r in rows:
        print(f"{r['rate']:>6} {r['completed']:>5} {r['req_per_s']:7.2f} {r['out_tok_per_s']:8.1f} "
              f"{r['ttft_p50_ms']:9.0f} {r['ttft_p99_ms']:9.0f} {r['tpot_p50_ms']:9.1f} {r['tpot_p99_ms']:9.1f} "
              f"{r['itl_p50_ms']:8.1f} {r['itl_p99_ms']:8.1f}")
    result: dict = {"rows": rows}
    if args.compare_engine:
        eng = in_child(engine_throughput, {}, prompts, args.output_len, args.runs)
        share = statistics.median(http_inf) / statistics.median(eng)
        result["engine_vs_http"] = {"engine_tok_s": eng, "http_tok_s": http_inf, "http_share": share}
        print(f"rate=inf output tok/s: HTTP {statistics.median(http_inf):.1f} "
              f"(runs {', '.join(f'{x:.1f}' for x in http_inf)}) "
              f"vs in-process Engine {statistics.median(eng):.1f} (runs {', '.join(f'{x:.1f}' for x in eng)}): "
              f"HTTP keeps {share:.1%} ({1 - share:+.1%} loss)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
