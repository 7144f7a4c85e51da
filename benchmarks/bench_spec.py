"""N-gram speculative decoding (--speculative-algorithm NGRAM) against plain decoding, same invocation.

Workloads (greedy, EOS ignored, prompts pre-filled once so the timed runs are decode-dominated):
  copy   a list the prompt asks the model to repeat (drafts mostly accepted)
  free   open-ended prompts (few n-gram matches: the cost of drafting when it rarely helps)
at batch sizes 1 and 4 (all requests submitted together). Each setting runs in its own child process
(embedded SmolLM2-135M, the CPU default dtype); reported: median decode tok/s over --runs, the ratio
NGRAM / off, and NGRAM's accepted / drafted tokens. --cpu-time: one torch thread, and tokens per CPU second
of the process instead of per wall second (a figure that other load on the machine barely moves).

    python benchmarks/bench_spec.py              # 3 runs each
    python benchmarks/bench_spec.py --runs 1 --new-tokens 32
    python benchmarks/bench_spec.py --cpu-time   # on a shared machine

--standalone: STANDALONE instead (docs/SPECULATIVE.md): the target (the embedded model, --dtype: the CPU
default or float32) drafted by its own .gguf's Q4_1 blocks (--quantization gguf as the draft) on W2 (the 32
ids of ../shared/peers/workloads.py, seed 3, 256 new tokens), per --num-steps; reported: median decode
tok/s off and on, the ratio and the accept length (tokens per verification step).

    python benchmarks/bench_spec.py --standalone --cpu-time --num-steps 2,4
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench_common import in_child

ITEMS = ("apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine, orange, "
         "papaya, quince, raspberry, strawberry, tangerine")
COPY = [f"Repeat this list exactly{'!' * i}: {ITEMS}.\nList: {ITEMS}.\nList again:" for i in range(4)]
FREE = ["Write a short story about a lighthouse keeper.", "Explain how a refrigerator works.",
        "Describe your ideal weekend in detail.", "What are the main causes of the French Revolution?"]


def measure(spec: bool, prompts: list[str], new_tokens: int, runs: int, cpu_time: bool, q) -> None:
    import torch

    from radixlang_runtime import Engine

    if cpu_time:
        torch.set_num_threads(1)
    clock = time.process_time if cpu_time else time.perf_counter

    kw = {"speculative_algorithm": "NGRAM", "speculative_disable_by_batch_size": 0} if spec else {}
    eng = Engine(max_total_tokens=16384, **kw)
    sp = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    eng.generate(prompts, {**sp, "max_new_tokens": 1})  # prompts into the radix cache; warm-up
    rates, drafted, accepted = [], 0, 0
    for _ in range(runs):
        t0 = clock()
        outs = eng.generate(prompts, sp)
        dt = clock() - t0
        rates.append(sum(o["meta_info"]["completion_tokens"] for o in outs) / dt)
        drafted += sum(o["meta_info"]["spec_draft_tokens"] for o in outs)
        accepted += sum(o["meta_info"]["spec_accepted_tokens"] for o in outs)
    eng.shutdown()
    q.put({"tok_s": statistics.median(rates), "drafted": drafted, "accepted": accepted})


def w2_ids() -> list[int]:
    """W2 of ../shared/peers/workloads.py: numpy default_rng(3).integers(100, 49000, size=32)."""
    import numpy as np

    return [int(x) for x in np.random.default_rng(3).integers(100, 49000, size=32)]


def measure_standalone(steps: int, dtype: str, new_tokens: int, runs: int, cpu_time: bool, q) -> None:
    """steps 0: no speculation; else STANDALONE with the Q4_1 self-draft and `steps` draft tokens a step."""
    import torch

    from radixlang_runtime import Engine
    from radixlang_runtime.model.resolve import embedded_gguf_path

    if cpu_time:
        torch.set_num_threads(1)
    clock = time.process_time if cpu_time else time.perf_counter
    kw = {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": embedded_gguf_path(),
          "speculative_draft_model_quantization": "gguf", "speculative_num_steps": steps} if steps else {}
    eng = Engine(max_total_tokens=4096, dtype=dtype, **kw)
    ids = w2_ids()
    sp = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    eng.generate(input_ids=ids, sampling_params={**sp, "max_new_tokens": 1})  # prompt cached; warm-up
    rates, outs = [], None
    for _ in range(runs):
        t0 = clock()
        out = eng.generate(input_ids=ids, sampling_params=sp)
        rates.append(out["meta_info"]["completion_tokens"] / (clock() - t0))
        outs = out["output_ids"]
    stats = eng.get_stats()
    eng.shutdown()
    q.put({"tok_s": statistics.median(rates), "ids": outs, "dtype": stats["cpu"]["dtype"],
           "accept": (stats["spec_accept_length"] or {}).get("mean_accept_length", 0.0)})


def main_standalone(a) -> None:
    unit = "tok/cpu-s" if a.cpu_time else "tok/s"
    off = in_child(measure_standalone, 0, a.dtype, a.new_tokens, a.runs, a.cpu_time)
    print(f"W2, target {off['dtype']}, draft: the same .gguf's Q4_1 blocks; off: {off['tok_s']:.1f} {unit}")
    print(f"{'steps':>5} {'STANDALONE ' + unit:>20} {'ratio':>6} {'accept length':>14} {'same ids':>9}")
    for steps in (int(x) for x in a.num_steps.split(",")):
        on = in_child(measure_standalone, steps, a.dtype, a.new_tokens, a.runs, a.cpu_time)
        print(f"{steps:>5} {on['tok_s']:>20.1f} {on['tok_s'] / off['tok_s']:>6.2f} {on['accept']:>14.2f} "
              f"{str(on['ids'] == off['ids']):>9}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--batch-sizes", default="1,4")
    ap.add_argument("--cpu-time", action="store_true", help="one torch thread; tokens per CPU second")
    ap.add_argument("--standalone", action="store_true", help="STANDALONE with the Q4_1 self-draft on W2")
    ap.add_argument("--num-steps", default="2,4", help="--standalone: draft steps to measure")
    ap.add_argument("--dtype", default="auto", help="--standalone: the target's dtype")
    a = ap.parse_args()
    if a.cpu_time:
        os.environ["OMP_NUM_THREADS"] = "1"  # the children's OpenMP pool (spawned processes inherit it)
    if a.standalone:
        if a.new_tokens == 96:
            a.new_tokens = 256  # W2's length
        main_standalone(a)
        return
    unit = "tok/cpu-s" if a.cpu_time else "tok/s"
    print(f"{'workload':<8} {'batch':>5} {'off ' + unit:>13} {'NGRAM ' + unit:>15} {'ratio':>6} "
          f"{'accepted/drafted':>17}")
    for name, prompts in (("copy", COPY), ("free", FREE)):
        for b in (int(x) for x in a.batch_sizes.split(",")):
            off = in_child(measure, False, prompts[:b], a.new_tokens, a.runs, a.cpu_time)
            on = in_child(measure, True, prompts[:b], a.new_tokens, a.runs, a.cpu_time)
            print(f"{name:<8} {b:>5} {off['tok_s']:>13.1f} {on['tok_s']:>15.1f} {on['tok_s'] / off['tok_s']:>6.2f} "
                  f"{on['accepted']:>8}/{on['drafted']:<8}", flush=True)


if __name__ == "__main__":
    main()
