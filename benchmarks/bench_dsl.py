"""DSL programs through run_batch over three client paths against one server:
  (a) zmq      the default `RuntimeEndpoint(http URL)`: it finds the server's ZeroMQ link and runs over it;
               traced prefix pre-filled once, batched threads
  (b) http     `RuntimeEndpoint(http URL, link="http")`: the native HTTP API, same program and batching
  (c) naive    HTTP, one program (so one request) at a time, no prefix pre-caching
Workloads: few-shot (8 shared examples, 64 questions) and a branching agent (select an action,
fork two branches, gen in each). Reports programs/s, prefill tokens computed and the cache hit rate
(from the server's /server_info stats). The cache is flushed before every run; each mode runs --runs
times, the modes taking turns (a different order each round, so warm-up and drift hit all alike), and
the table shows medians.

    .venv/bin/python benchmarks/bench_dsl.py                       # starts its own server (sgl.Runtime)
    .venv/bin/python benchmarks/bench_dsl.py --questions 8 --max-tokens 4   # a tiny smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import radixlang as sgl  # noqa: E402
from radixlang.global_config import global_config  # noqa: E402

SHOTS = [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"),
         ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Chile", "Santiago")]
COUNTRIES = ["Norway", "India", "Brazil", "Ghana", "Poland", "Vietnam", "Mexico", "Greece", "Nepal", "Cuba",
             "Iran", "Fiji", "Laos", "Mali", "Oman", "Chad"]


def make_programs(shots: int, max_tokens: int):
    prefix = "Answer with the capital city.\n" + "".join(
        f"Q: What is the capital of {c}?\nA: {a}\n" for c, a in SHOTS[:shots])

    @sgl.function
    def few_shot(s, question):
        s += prefix
        s += "Q: " + question + "\nA:" + sgl.gen("answer", stop="\n", max_tokens=max_tokens)

    @sgl.function
    def agent(s, task):
        s += sgl.system("You are a planning agent. Decide, then explore two options briefly.")
        s += sgl.user("Task: " + task)
        with s.assistant():
            s += "Action: " + sgl.select("action", ["plan", "answer"]) + "\n"
            forks = s.fork(2)
            forks += lambda i: f"Option {i + 1}:" + sgl.gen("option", stop="\n", max_tokens=max_tokens)
            forks.join()
            s += "Decision:" + sgl.gen("decision", stop="\n", max_tokens=max_tokens)

    return few_shot, agent


def stats(backend) -> dict:
    return backend.get_server_info()["stats"]


def run_one(backend, program, batch, mode: str) -> dict:
    assert backend.flush_cache(), "flush refused: the server is busy"
    before = stats(backend)
    global_config.enable_precache_with_tracing = mode != "naive"
    t0 = time.perf_counter()
    states = program.run_batch(batch, backend=backend, temperature=0, num_threads=1 if mode == "naive" else 64)
    elapsed = time.perf_counter() - t0
    global_config.enable_precache_with_tracing = True
    errors = [st.error() for st in states if st.error() is not None]
    if errors:
        raise RuntimeError(f"{mode}: {len(errors)} programs failed, first: {errors[0]!r}")
    after = stats(backend)
    computed = after["prefill_tokens_computed"] - before["prefill_tokens_computed"]
    cached = after["prefill_tokens_cached"] - before["prefill_tokens_cached"]
    return {"mode": mode, "programs": len(batch), "seconds": round(elapsed, 2),
            "programs_per_s": round(len(batch) / elapsed, 2), "prefill_tokens_computed": computed,
            "cache_hit_rate": round(cached / max(1, computed + cached), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=64)
    ap.add_argument("--shots", type=int, default=8)
    ap.add_argument("--agents", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--modes", default="zmq,http,naive")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    few_shot, agent = make_programs(args.shots, args.max_tokens)
    questions = [{"question": f"What is the capital of {COUNTRIES[i % len(COUNTRIES)]}?" + " " * (i // len(COUNTRIES))}
                 for i in range(args.questions)]
    tasks = [{"task": f"organise event number {i} for the team"} for i in range(args.agents)]
    with sgl.Runtime(dtype=args.dtype, max_total_tokens=16384) as rt:
        links = {"zmq": sgl.RuntimeEndpoint(rt.url), "http": sgl.RuntimeEndpoint(rt.url, link="http"),
                 "naive": sgl.RuntimeEndpoint(rt.url, link="http")}
        assert links["zmq"].transport == "zmq", "the default RuntimeEndpoint did not find the ZeroMQ link"
        few_shot.run(backend=rt.endpoint, **questions[0]).sync()  # warm-up (first-call costs)
        modes = args.modes.split(",")
        for name, program, batch in (("few_shot", few_shot, questions), ("agent", agent, tasks)):
            runs: dict[str, list[dict]] = {m: [] for m in modes}
            for r in range(args.runs):
                for mode in modes[r % len(modes):] + modes[: r % len(modes)]:  # rotate the order
                    runs[mode].append(run_one(links[mode], program, batch, mode))
            for mode in modes:
                rs = runs[mode]
                row = {"workload": name, **rs[0], "runs": len(rs),
                       **{k: statistics.median(x[k] for x in rs) for k in
                          ("seconds", "programs_per_s", "prefill_tokens_computed", "cache_hit_rate")}}
                print(json.dumps(row), flush=True)
            if "naive" in runs:
                base = statistics.median(x["programs_per_s"] for x in runs["naive"])
                print(json.dumps({"workload": name, "speedup_vs_naive": {
                    m: round(statistics.median(x["programs_per_s"] for x in runs[m]) / base, 2)
                    for m in modes if m != "naive"}}), flush=True)

if __name__ == "__main__":
    main()
