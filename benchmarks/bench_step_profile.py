"""Single-stream decode, one step taken apart: per-phase milliseconds and Python calls per decode step.

One request (W2 of bench_offline.py: a 32-token prompt, 256 new tokens, greedy, EOS ignored) in an
in-process Engine. Two figures, in separate passes over the same request:

  calls per step   every Python function call (and C call) on the scheduler thread, counted with
                   sys.setprofile over the whole request and divided by its forward steps; insensitive to
                   the machine's load. --top N lists the functions whose counts differ most between trees.
  ms per phase     perf_counter around each phase of a step, medians over the decode steps:
                   schedule (Scheduler.get_next_batch_to_run), prepare (the runner's ForwardBatch and the
                   attention backend's metadata), model (the model's forward, weights read here; inside it
                   layers: the fused decode layers' C call, head: the final norm's output to logits), sample
                   (sample_step), results (Scheduler._process_batch_result), step (all of Scheduler.step),
                   loop (one RequestLoop iteration: intake, step, emit) and outside = loop - model; each
                   as wall time and as the scheduler thread's CPU time (time.thread_time: preemption by
                   other processes left out; with --threads 1 the forward's whole work is on that thread);
                   model_p10: the 10th percentile of the model's steps, the ones other processes disturbed least.

Each tree (a checkout of radixlang: its own radixlang_runtime/ and kernels/) runs in its own child
process from its own root with PYTHONPATH=.:kernels, so an older checkout can be set beside this one;
--rounds repeats the trees interleaved (A B A B ...) against a loaded machine's drift.

    python benchmarks/bench_step_profile.py                                  # this tree
    python benchmarks/bench_step_profile.py --trees /path/to/old,. --rounds 3 --top 25
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

PROMPT = 32


def _timed(store: dict, name: str, fn):
    """fn with its wall time (store[name]) and its thread's CPU time (store[name + "_cpu"]) recorded per call."""
    def wrapper(*args, **kwargs):
        t, c = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            store[name + "_cpu"].append(time.thread_time() - c)
            store[name].append(time.perf_counter() - t)
    return wrapper


def _instrument(eng, store: dict) -> None:
    """perf_counter around each phase (instance and class attributes of either tree's layout)."""
    from radixlang_runtime.scheduler.loop import RequestLoop

    sched, runner = eng.scheduler, eng.scheduler.runner
    sched.get_next_batch_to_run = _timed(store, "schedule", sched.get_next_batch_to_run)
    sched._process_batch_result = _timed(store, "results", sched._process_batch_result)
    sched.step = _timed(store, "step", sched.step)
    runner._build_forward_batch = _timed(store, "prepare_fb", runner._build_forward_batch)
    runner.backend.init_forward_metadata = _timed(store, "prepare_meta", runner.backend.init_forward_metadata)
    model = runner.model
    model.forward = _timed(store, "model", model.forward)
    if getattr(model, "fused_decode", None) is not None:  # inside the model: the layers, then the head
        model.fused_decode.run = _timed(store, "layers", model.fused_decode.run)
    if hasattr(model, "head_logits"):
        model.head_logits = _timed(store, "head", model.head_logits)
    mod = sys.modules[type(runner).__module__]
    mod.sample_step = _timed(store, "sample", mod.sample_step)
    RequestLoop._iterate = _timed(store, "loop", RequestLoop._iterate)


def _run(eng, ids: list[int], new: int) -> None:
    sp = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    assert eng.flush_cache()
    out = eng.generate(input_ids=ids, sampling_params=sp)
    assert out["meta_info"]["completion_tokens"] == new


def _count_calls(eng, ids: list[int], new: int) -> tuple[float, dict]:
    counts: collections.Counter = collections.Counter()

    def prof(frame, event, arg):
        if event == "call":
            co = frame.f_code
            counts[f"{os.path.basename(co.co_filename)}:{co.co_name}"] += 1
        elif event == "c_call":
            counts[f"<c>:{getattr(arg, '__qualname__', getattr(arg, '__name__', '?'))}"] += 1

    steps0 = eng._loop.call(lambda s: s.forward_steps)
    eng._loop.call(lambda s: sys.setprofile(prof))
    _run(eng, ids, new)
    eng._loop.call(lambda s: sys.setprofile(None))
    steps = eng._loop.call(lambda s: s.forward_steps) - steps0
    return sum(counts.values()) / steps, {k: v / steps for k, v in counts.items()}


def child(a) -> None:
    import random

    from radixlang_runtime import Engine

    rng = random.Random(0)
    ids = [rng.randrange(100, 49000) for _ in range(PROMPT)]
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    eng = Engine(a.model_path, dtype=a.dtype)
    try:
        _run(eng, ids, 16)  # warm-up
        per_step, by_fn = _count_calls(eng, ids, min(a.new, 64))
        store: dict = collections.defaultdict(list)
        _instrument(eng, store)
        t = time.perf_counter()
        _run(eng, ids, a.new)
        wall = time.perf_counter() - t
        phases = {k: 1e3 * statistics.median(v) for k, v in store.items()}
        for sfx in ("", "_cpu"):  # the least disturbed steps: other processes' cache and memory traffic left out
            phases["model_p10" + sfx] = 1e3 * sorted(store["model" + sfx])[len(store["model" + sfx]) // 10]
        for sfx in ("", "_cpu"):
            phases["prepare" + sfx] = phases.pop("prepare_fb" + sfx) + phases.pop("prepare_meta" + sfx)
            phases["outside" + sfx] = phases["loop" + sfx] - phases["model" + sfx]
        print(json.dumps({"calls_per_step": per_step, "by_fn": by_fn, "ms": phases, "tok_s": a.new / wall,
                          "dtype": str(eng.runner.dtype).replace("torch.", "")}))
    finally:
        eng.shutdown()


def run_tree(tree: str, a) -> dict:
    env = {**os.environ, "PYTHONPATH": ".:kernels"}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--new", str(a.new), "--dtype", a.dtype,
           "--threads", str(a.threads)]
    if a.model_path:
        cmd += ["--model-path", a.model_path]
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{tree}: child failed\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


PHASES = ["schedule", "prepare", "model", "model_p10", "layers", "head", "sample", "results", "step", "loop", "outside"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", default=".", help="comma-separated checkout roots, each run from its root")
    ap.add_argument("--rounds", type=int, default=1, help="the trees run interleaved this many times")
    ap.add_argument("--new", type=int, default=256, help="new tokens of the one request")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--model-path", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads in each child (0: its default); 1 makes the thread CPU times whole steps")
    ap.add_argument("--top", type=int, default=0, help="list the N functions whose calls per step differ most")
    ap.add_argument("--json", default=None, help="also write every run's figures (calls per function too) here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    trees = a.trees.split(",")
    res: dict[str, list[dict]] = {t: [] for t in trees}
    for r in range(a.rounds):
        for t in trees:
            res[t].append(run_tree(t, a))
            x = res[t][-1]
            print(f"round {r} {t}: {x['calls_per_step']:.0f} calls/step, loop {x['ms']['loop']:.2f} ms, "
                  f"model {x['ms']['model']:.2f} ms, {x['tok_s']:.1f} tok/s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"\n{a.new} new tokens, {a.dtype}, {a.rounds} round(s), loadavg {' '.join(load)}; medians over rounds of "
          "each run's median ms per decode step")
    print(f"{'tree':<28} {'clock':<6} {'calls/step':>10} " + " ".join(f"{p:>9}" for p in PHASES) + f" {'tok/s':>7}")
    for t in trees:
        calls = statistics.median(x["calls_per_step"] for x in res[t])
        tok = statistics.median(x["tok_s"] for x in res[t])
        for clock, sfx in (("wall", ""), ("cpu", "_cpu")):
            ms = [statistics.median(x["ms"].get(p + sfx, float("nan")) for x in res[t]) for p in PHASES]
            print(f"{t[-28:]:<28} {clock:<6} {calls:>10.0f} " + " ".join(f"{m:>9.3f}" for m in ms) + f" {tok:>7.1f}")
    if a.top and len(trees) >= 2:
        first, last = res[trees[0]][0]["by_fn"], res[trees[-1]][0]["by_fn"]
        diff = {k: last.get(k, 0) - first.get(k, 0) for k in set(first) | set(last)}
        print(f"\ncalls per step, {trees[-1]} minus {trees[0]} (largest differences)")
        for k, d in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:a.top]:
            print(f"  {d:+9.1f}  {k}  ({first.get(k, 0):.1f} -> {last.get(k, 0):.1f})")
    elif a.top:
        for k, v in sorted(res[trees[0]][0]["by_fn"].items(), key=lambda kv: -kv[1])[:a.top]:
            print(f"  {v:9.1f}  {k}")


if __name__ == "__main__":
    main()
