"""Intake cost of the OpenAI routes: sequential requests that generate one token, so the time is the route's
own work (parsing, the chat template, tokenizing, the tools' plan, building the runtime requests) plus one
short forward pass. Several servers are measured side by side, in alternating rounds, in one run.

    python benchmarks/bench_intake.py --base-url http://127.0.0.1:30000 --base-url http://127.0.0.1:30001

Per server and route: the median and p90 of the request latency over all rounds (ms), and each server's
median as a ratio of the first server's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
BODIES = {
    "/v1/chat/completions": {"model": "default", "max_tokens": 1, "temperature": 0,
                             "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                          {"role": "user", "content": "What is the weather in Paris today?"}]},
    "/v1/chat/completions (tools)": {"model": "default", "max_tokens": 1, "temperature": 0, "tools": TOOLS,
                                     "messages": [{"role": "user", "content": "Weather in Rome?"}]},
    "/v1/completions": {"model": "default", "max_tokens": 1, "temperature": 0,
                        "prompt": "The capital of France is", "stop": ["\n"]},
}


def one_round(client: httpx.Client, route: str, body: dict, n: int) -> list[float]:
    path = route.split(" ")[0]
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.post(path, json=body)
        out.append((time.perf_counter() - t0) * 1000)
        if r.status_code != 200:
            raise SystemExit(f"{client.base_url}{path}: {r.status_code} {r.text[:300]}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", action="append", required=True, help="a running server (repeat to compare)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=40, help="per route, server and round")
    ap.add_argument("--json")
    args = ap.parse_args()
    clients = [httpx.Client(base_url=u, timeout=120) for u in args.base_url]
    for c in clients:  # warm-up: templates compiled, caches filled
        for route, body in BODIES.items():
            one_round(c, route, body, 3)
    times: dict[tuple[str, str], list[float]] = {(u, r): [] for u in args.base_url for r in BODIES}
    for _ in range(args.rounds):
        for u, c in zip(args.base_url, clients):
            for route, body in BODIES.items():
                times[(u, route)] += one_round(c, route, body, args.requests)
    rows = []
    for route in BODIES:
        base = statistics.median(times[(args.base_url[0], route)])
        for u in args.base_url:
            t = sorted(times[(u, route)])
            med = statistics.median(t)
            rows.append({"route": route, "server": u, "median_ms": round(med, 3),
                         "p90_ms": round(t[int(0.9 * (len(t) - 1))], 3), "ratio": round(med / base, 3)})
    for r in rows:
        print(f"{r['route']:<32} {r['server']:<28} median {r['median_ms']:8.2f} ms  p90 {r['p90_ms']:8.2f} ms  "
              f"x{r['ratio']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
