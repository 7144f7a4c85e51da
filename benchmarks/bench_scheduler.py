"""Scheduler cost and chunked-prefill latency.

Part 1 (no model): CPU time of one scheduler iteration (batch formation + result processing, radix
cache on) while N requests decode, with a runner that does nothing, for N = 64, 256, 1024. Goal:
< 2 ms at 256.

Part 2 (the real model, in-process Engine, streaming): an online mix. Short chat-like requests
(64 prompt tokens -> 48 new) arrive as a Poisson process while long prompts (2,048 tokens -> 8 new)
arrive every few seconds. Reported per setting: TTFT and inter-token latency (ITL) p50 / p99 of the
short requests, with chunked prefill on (chunk 256, decode steps interleaved between chunks), on
with --enable-mixed-chunk, and off (each long prompt is one forward pass that stalls decoding).
Each setting runs in its own child process with the same arrival schedule.

    python benchmarks/bench_scheduler.py            # both parts
    python benchmarks/bench_scheduler.py --part 1
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import threading
import time

from bench_common import in_child, percentile


# ---------------------------------------------------------------------------------------- part 1
class NullRunner:
    def forward(self, batch) -> None:
        batch.next_token_ids = [1] * sum(batch.sample)


def scheduler_iteration_ms(n_running: int, steps: int = 200) -> dict:
    from radixlang_runtime.mem.allocator import PageAllocator
    from radixlang_runtime.mem.radix_cache import RadixCache
    from radixlang_runtime.mem.table import TableManager
    from radixlang_runtime.protocol.sampling_params import SamplingParams
    from radixlang_runtime.scheduler.kv_manager import KVManager
    from radixlang_runtime.scheduler.request import Req
    from radixlang_runtime.scheduler.scheduler import Scheduler, SchedulerConfig

    prompt, page = 128, 16
    slots = n_running * (prompt + steps + 2 * page)
    cfg = SchedulerConfig(page_size=page, context_len=4096, max_running_requests=n_running,
                          max_prefill_tokens=1 << 20, chunked_prefill_size=-1, eos_token_ids=(2,))
    kv = KVManager(PageAllocator(slots, page), TableManager(n_running), RadixCache(page))
    sched = Scheduler(cfg, NullRunner(), kv, detokenize=lambda ids: "")
    rng = random.Random(0)
    sp = SamplingParams.from_dict({"max_new_tokens": steps + 10, "ignore_eos": True})
    for i in range(n_running):
        sched.add_request(Req(f"r{i}", [rng.randrange(3, 49000) for _ in range(prompt)], sp))
    sched.step()  # one prefill of everything
    assert len(sched.running) == n_running
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        sched.step()
        times.append((time.perf_counter() - t) * 1e3)
    return {"running": n_running, "median_ms": statistics.median(times), "p99_ms": sorted(times)[int(0.99 * steps)]}


# ---------------------------------------------------------------------------------------- part 2
def schedule(seed: int = 0) -> list[tuple[float, str, list[int], int]]:
    """(arrival s, kind, prompt ids, max_new_tokens), the same for every setting."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(24):
        t += rng.expovariate(2.0)  # 2 short requests / s
        out.append((t, "short", [rng.randrange(100, 49000) for _ in range(64)], 48))
    for t in (1.0, 4.0, 7.0):
        out.append((t, "long", [rng.randrange(100, 49000) for _ in range(2048)], 8))
    return sorted(out, key=lambda x: x[0])


def online_run(setting: dict, out: mp.Queue) -> None:
    from radixlang_runtime import Engine

    eng = Engine(max_total_tokens=16384, **setting["args"])
    try:
        eng.generate(input_ids=list(range(100, 164)), sampling_params={"max_new_tokens": 4})  # warm-up
        records: list[dict] = []
        lock = threading.Lock()

        def client(arrival: float, kind: str, ids: list[int], n: int, t0: float) -> None:
            time.sleep(max(0.0, t0 + arrival - time.perf_counter()))
            sent = time.perf_counter()
            stamps, seen = [], 0
            for chunk in eng.generate(input_ids=ids, sampling_params={"max_new_tokens": n, "temperature": 0,
                                                                      "ignore_eos": True}, stream=True):
                now = time.perf_counter()
                k = len(chunk["output_ids"])
                stamps += [now] * (k - seen)
                seen = k
            with lock:
                records.append({"kind": kind, "ttft": stamps[0] - sent,
                                "itl": [b - a for a, b in zip(stamps, stamps[1:])]})

        t0 = time.perf_counter() + 0.2
        threads = [threading.Thread(target=client, args=(*x, t0)) for x in schedule()]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
    finally:
        eng.shutdown()
    out.put({"records": records, "wall": wall})


def part2() -> list[dict]:
    settings = [
        {"name": "chunked 256", "args": {"chunked_prefill_size": 256, "max_prefill_tokens": 4096}},
        {"name": "chunked 256 + mixed", "args": {"chunked_prefill_size": 256, "max_prefill_tokens": 4096,
                                                 "enable_mixed_chunk": True}},
        {"name": "unchunked", "args": {"chunked_prefill_size": -1, "max_prefill_tokens": 4096}},
    ]
    rows = []
    for s in settings:
        res = in_child(online_run, s)
        short = [r for r in res["records"] if r["kind"] == "short"]
        long = [r for r in res["records"] if r["kind"] == "long"]
        ttft = [r["ttft"] * 1e3 for r in short]
        itl = [x * 1e3 for r in short for x in r["itl"]]
        rows.append({"setting": s["name"], "ttft_p50_ms": percentile(ttft, 0.5), "ttft_p99_ms": percentile(ttft, 0.99),
                     "itl_p50_ms": percentile(itl, 0.5), "itl_p99_ms": percentile(itl, 0.99), "itl_max_ms": max(itl),
                     "long_ttft_p50_ms": percentile([r["ttft"] * 1e3 for r in long], 0.5), "wall_s": res["wall"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", type=int, choices=(1, 2))
    ap.add_argument("--json")
    args = ap.parse_args()
    result: dict = {}
    if args.part in (None, 1):
        result["iteration"] = [scheduler_iteration_ms(n) for n in (64, 256, 1024)]
        print("scheduler iteration (decode, null runner):")
        for r in result["iteration"]:
            print(f"  {r['running']:5d} running: median {r['median_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms")
    if args.part in (None, 2):
        result["online"] = part2()
        print(f"{'setting':22} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'ITL max':>8} "
              f"{'long TTFT':>10} {'wall s':>7}   (ms; short requests)")
        for r in result["online"]:
            print(f"{r['setting']:22} {r['ttft_p50_ms']:9.0f} {r['ttft_p99_ms']:9.0f} {r['itl_p50_ms']:8.0f} "
                  f"{r['itl_p99_ms']:8.0f} {r['itl_max_ms']:8.0f} {r['long_ttft_p50_ms']:10.0f} {r['wall_s']:7.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
