"""N-gram speculative decoding (--speculative-algorithm NGRAM) against plain decoding, same invocation.

Workloads (greedy, EOS ignored; before each timed run the radix cache is flushed and the prompts pre-filled
with one token, so the timed runs are decode-dominated and no run drafts from a previous run's output):
  code_edit     rewrite an 803-token Python file with functions renamed (benchmarks/data/spec_prompts.json)
  quotes        answer questions with exact quotes from a passage
  json_extract  a JSON list of the people in a document
  free          W2's ids (bench_offline.py: 32 random ids; batch > 1 adds more random prompts): free
                generation, where drafts rarely match (the cost of drafting when it does not help)
  W1            (--w1) bench_offline's W1 at batch 64 (64 x 256 random ids -> --new-tokens)
at batch sizes 1 and 4 (all requests submitted together; batch b of a copy workload: b variants of its
prompt). Each setting runs in its own child process (embedded SmolLM2-135M, the CPU default dtype) with
--threads torch threads (default 1: a shared machine's load then moves CPU time little); reported: medians
over --runs of decode tok/s (wall clock) and tok per CPU second of the process, the NGRAM / off ratios of
both, and NGRAM's accepted / drafted tokens.

    python benchmarks/bench_spec.py                      # 3 runs each, batch 1 and 4
    python benchmarks/bench_spec.py --runs 1 --new-tokens 32 --workloads code_edit,free
    python benchmarks/bench_spec.py --w1 --batch-sizes 64 --workloads W1
    python benchmarks/bench_spec.py --step-cost          # decode step time vs rows (drafter.ROW_COST's basis)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

from bench_common import in_child

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "spec_prompts.json")
COPY = ("code_edit", "quotes", "json_extract")


def prompts_for(name: str, b: int, new_tokens: int) -> dict:
    """{"prompt": [...]} or {"input_ids": [...]}: the b prompts of workload `name` at batch size b."""
    if name in COPY:
        with open(DATA) as f:
            base = json.load(f)[name]
        return {"prompt": [base if i == 0 else f"Task {i}.\n{base}" for i in range(b)]}
    from bench_offline import workloads

    wl = workloads(quick=False)
    if name == "W1":
        return {"input_ids": wl["W1"]["ids"][:b]}
    rng = random.Random(1)
    extra = [[rng.randrange(100, 49000) for _ in range(32)] for _ in range(b - 1)]
    return {"input_ids": (wl["W2"]["ids"] + extra)[:b]}


def measure(spec: bool, prompts: dict, new_tokens: int, runs: int, threads: int, q) -> None:
    import torch

    from radixlang_runtime import Engine

    torch.set_num_threads(threads)
    kw = {"speculative_algorithm": "NGRAM"} if spec else {}
    eng = Engine(max_total_tokens=65536, **kw)
    sp = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    walls, cpus, drafted, accepted = [], [], 0, 0
    for _ in range(runs + 1):  # the first run warms up
        assert eng.flush_cache(), "flush_cache refused"
        eng.generate(**prompts, sampling_params={**sp, "max_new_tokens": 1})  # prompts pre-filled, untimed
        w0, c0 = time.perf_counter(), time.process_time()
        outs = eng.generate(**prompts, sampling_params=sp)
        w, c = time.perf_counter() - w0, time.process_time() - c0
        n = sum(o["meta_info"]["completion_tokens"] for o in outs)
        walls.append(n / w)
        cpus.append(n / c)
        drafted += sum(o["meta_info"].get("spec_draft_tokens", 0) for o in outs)
        accepted += sum(o["meta_info"].get("spec_accepted_tokens", 0) for o in outs)
    eng.shutdown()
    q.put({"wall": statistics.median(walls[1:]), "cpu": statistics.median(cpus[1:]), "drafted": drafted,
           "accepted": accepted})


def step_cost(threads: int, q) -> None:
    """CPU time of one decode step of M rows (each a request at context 256), M = 1 .. 64."""
    import torch

    from radixlang_runtime.model.resolve import resolve_model_dir
    from radixlang_runtime.model.runner import ModelRunner, StepInputs
    from radixlang_runtime.server_args import ServerArgs

    torch.set_num_threads(threads)
    r = ModelRunner(ServerArgs(max_total_tokens=20000, max_running_requests=128), resolve_model_dir(None, None))
    ctx, V, stride, out = 256, r.cfg.vocab_size, 264, {}
    for i in range(64):
        ids = [(j * 7919 + i) % V for j in range(ctx)]
        r.run_step(StepInputs("extend", ids, list(range(i * stride, i * stride + ctx)), [i], [0], [ctx], [], [ctx - 1]))
    for M in (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64):
        step = StepInputs("decode", [5] * M, [i * stride + ctx for i in range(M)], list(range(M)), [ctx] * M,
                          [1] * M, [], list(range(M)))
        for _ in range(2):
            r.run_step(step)
        c0 = time.process_time()
        for _ in range(8):
            r.run_step(step)
        out[M] = (time.process_time() - c0) / 8
    q.put(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--batch-sizes", default="1,4")
    ap.add_argument("--workloads", default="code_edit,quotes,json_extract,free")
    ap.add_argument("--w1", action="store_true", help="allow the W1 workload (64 prompts; use --batch-sizes 64)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--step-cost", action="store_true", help="only the decode step's cost vs rows")
    a = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)  # the children's OpenMP pool (spawned processes inherit it)
    if a.step_cost:
        cost = in_child(step_cost, a.threads)
        for M, t in cost.items():
            print(f"rows {M:3d}: {t * 1e3:7.2f} ms  ({t * 1e3 / M:5.2f} ms a row)")
        return
    print(f"{'workload':<13} {'batch':>5} {'off tok/s':>10} {'NGRAM tok/s':>12} {'ratio':>6} {'off tok/cpu-s':>14} "
          f"{'NGRAM tok/cpu-s':>16} {'ratio':>6} {'accepted/drafted':>17}")
    for name in a.workloads.split(","):
        if name == "W1" and not a.w1:
            raise SystemExit("W1 needs --w1 (64 prompts: minutes per setting)")
        for b in (int(x) for x in a.batch_sizes.split(",")):
            prompts = prompts_for(name, b, a.new_tokens)
            off = in_child(measure, False, prompts, a.new_tokens, a.runs, a.threads)
            on = in_child(measure, True, prompts, a.new_tokens, a.runs, a.threads)
            print(f"{name:<13} {b:>5} {off['wall']:>10.1f} {on['wall']:>12.1f} {on['wall'] / off['wall']:>6.2f} "
                  f"{off['cpu']:>14.1f} {on['cpu']:>16.1f} {on['cpu'] / off['cpu']:>6.2f} "
                  f"{on['accepted']:>8}/{on['drafted']:<8}", flush=True)


if __name__ == "__main__":
    main()
