"""What the live view costs.

1. summarize_tree on a random radix tree of ~10,000 nodes (the state's heaviest part): median time
   and the JSON size of a whole /dashboard/state-like answer's tree.
2. A real server (fp32, the embedded model) decoding a batch of requests, with and without a client
   polling /dashboard/state at 4 Hz (plus one page-like poller at 2 Hz), runs alternating, medians of
   --runs: output tok/s and the ratio.

    .venv/bin/python benchmarks/bench_dashboard.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from server_utils import ServerProcess  # noqa: E402
from test_dashboard import _random_tree  # noqa: E402

from radixlang_runtime.mem.radix_summary import summarize_tree  # noqa: E402


def bench_summary() -> None:
    cache = _random_tree(7000)
    n = sum(1 for _ in cache._nodes())
    times = []
    for _ in range(9):
        t = time.perf_counter()
        out = summarize_tree(cache)
        times.append(time.perf_counter() - t)
    print(f"tree summary: {n} nodes -> {out['shown_nodes']} shown, median {statistics.median(times) * 1e3:.1f} ms, "
          f"{len(json.dumps(out)) / 1024:.1f} KB JSON")


def bench_server(runs: int) -> None:
    srv = ServerProcess("--dtype", "float32", "--max-total-tokens", "16384")
    try:
        prompts = [f"Write a short story about robot number {i}." for i in range(32)]
        body = {"text": prompts, "sampling_params": {"max_new_tokens": 96, "temperature": 0, "ignore_eos": True}}
        with httpx.Client(base_url=srv.url, timeout=600) as c:
            c.post("/generate", json={"text": "warm up", "sampling_params": {"max_new_tokens": 4}})
            rates: dict[bool, list[float]] = {False: [], True: []}
            state_ms: list[float] = []
            for r in range(runs):
                for polled in ((False, True) if r % 2 == 0 else (True, False)):
                    c.post("/flush_cache")
                    stop = threading.Event()

                    def poll(hz: float) -> None:
                        with httpx.Client(base_url=srv.url, timeout=60) as pc:
                            while not stop.is_set():
                                t = time.perf_counter()
                                pc.get("/dashboard/state")
                                state_ms.append((time.perf_counter() - t) * 1e3)
                                stop.wait(1 / hz)

                    pollers = [threading.Thread(target=poll, args=(hz,)) for hz in ((4.0, 2.0) if polled else ())]
                    for p in pollers:
                        p.start()
                    t = time.perf_counter()
                    outs = c.post("/generate", json=body).json()
                    dt = time.perf_counter() - t
                    stop.set()
                    for p in pollers:
                        p.join()
                    rates[polled].append(sum(o["meta_info"]["completion_tokens"] for o in outs) / dt)
        off, on = statistics.median(rates[False]), statistics.median(rates[True])
        print(f"32 x 96 tokens, fp32, medians of {runs}: {off:.1f} tok/s without polling, {on:.1f} with "
              f"/dashboard/state polled at 4 Hz + 2 Hz ({on / off:.1%}); state answered in median "
              f"{statistics.median(state_ms):.1f} ms")
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    bench_summary()
    bench_server(args.runs)


if __name__ == "__main__":
    main()
