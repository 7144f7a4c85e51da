"""Priority scheduling under load: how soon urgent requests start while a batch of long low-priority ones holds the
running slots, with --enable-priority-scheduling (the urgent ones carry a higher `priority` and retract running
requests) against the same server in arrival order (no flag, no `priority`).

Each round starts one server per mode (the modes interleaved A B A B ... against a loaded machine's drift), sends
--background long requests at once (each --background-tokens tokens, ignore_eos), then after --lead seconds one
urgent request every --gap seconds (--urgent of them, --urgent-tokens each). Reported per mode, medians over the
rounds: the urgent requests' time to first token (median and p90) and end-to-end time, the background batch's
wall time (what the retractions cost it), and the retractions the server counted (per round also how the
retracted requests' K/V came back: kept in the radix cache, swapped in, or recomputed).

    python benchmarks/bench_priority.py --rounds 3
    python benchmarks/bench_priority.py --rounds 3 --max-running-requests 4 --background 12
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import Proc, free_port, percentile  # noqa: E402

START_TIMEOUT_S = 600
MODES = ("priority", "arrival")



def _server(flags: list[str]) -> Proc:
    port = free_port()
    srv = Proc("priority", [sys.executable, "-m", "radixlang_runtime.launch_server", "--port", str(port), *flags],
               port)
    srv.up(START_TIMEOUT_S)
    return srv


def _body(text: str, tokens: int, priority: int | None) -> dict:
    b = {"text": text, "stream": True, "sampling_params": {"max_new_tokens": tokens, "min_new_tokens": tokens,
                                                            "temperature": 0, "ignore_eos": True}}
    return b if priority is None else {**b, "priority": priority}


def _timed(url: str, body: dict, out: list, lock: threading.Lock) -> None:
    """One streamed request: (time to the first token, end-to-end), from its send."""
    t0 = time.perf_counter()
    first = None
    with httpx.stream("POST", url + "/generate", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if first is None and json.loads(line[6:])["output_ids"]:
                first = time.perf_counter() - t0
    with lock:
        out.append((first, time.perf_counter() - t0))


def run_round(mode: str, args: argparse.Namespace) -> dict:
    flags = ["--max-running-requests", str(args.max_running_requests), *args.server_flags]
    if mode == "priority":
        flags += ["--enable-priority-scheduling", "--priority-scheduling-preemption-threshold", "0"]
    srv = _server(flags)
    try:
        low, high = (0, 1) if mode == "priority" else (None, None)
        background: list = []
        urgent: list = []
        lock = threading.Lock()
        threads = [threading.Thread(target=_timed, args=(srv.url, _body(f"Story {i}: once upon a time, in a land "
                                                                         f"far away,", args.background_tokens, low),
                                                          background, lock)) for i in range(args.background)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(args.lead)
        probes = []
        for i in range(args.urgent):
            p = threading.Thread(target=_timed, args=(srv.url, _body(f"Question {i}: the capital of France is",
                                                                     args.urgent_tokens, high), urgent, lock))
            p.start()
            probes.append(p)
            time.sleep(args.gap)
        for t in threads + probes:
            t.join()
        batch_wall = max(e for _, e in background) if background else 0.0
        stats = httpx.get(srv.url + "/server_info", timeout=10).json()["stats"]
        ttft = [f for f, _ in urgent]
        return {"mode": mode, "ttft_p50": statistics.median(ttft), "ttft_p90": percentile(ttft, 0.9),
                "e2e_p50": statistics.median([e for _, e in urgent]), "batch_wall": batch_wall,
                "retractions": stats["num_retractions"], "readmit_tokens": stats["readmit_tokens"],
                "elapsed": time.perf_counter() - t0}
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-running-requests", type=int, default=4)
    ap.add_argument("--background", type=int, default=8, help="long low-priority requests sent at once")
    ap.add_argument("--background-tokens", type=int, default=128)
    ap.add_argument("--urgent", type=int, default=6, help="urgent requests, one every --gap seconds")
    ap.add_argument("--urgent-tokens", type=int, default=8)
    ap.add_argument("--lead", type=float, default=2.0, help="seconds before the first urgent request")
    ap.add_argument("--gap", type=float, default=0.5)
    ap.add_argument("server_flags", nargs="*", help="after --: flags for both servers")
    args = ap.parse_args()
    rows: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            row = run_round(mode, args)
            rows[mode].append(row)
            print(json.dumps({"round": r, **{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}}),
                  flush=True)
    print(f"\nmedians of {args.rounds} rounds (urgent requests' seconds; batch: the background requests' wall time)")
    print(f"{'mode':<10} {'TTFT p50':>9} {'TTFT p90':>9} {'e2e p50':>8} {'batch':>7} {'retractions':>12}")
    for mode in MODES:
        med = {k: statistics.median(row[k] for row in rows[mode])
               for k in ("ttft_p50", "ttft_p90", "e2e_p50", "batch_wall", "retractions")}
        print(f"{mode:<10} {med['ttft_p50']:>9.2f} {med['ttft_p90']:>9.2f} {med['e2e_p50']:>8.2f} "
              f"{med['batch_wall']:>7.2f} {med['retractions']:>12.0f}")


if __name__ == "__main__":
    main()
