"""What speculative NEXTN (the checkpoint's multi-token-prediction layer drafts; docs/SPECULATIVE.md) costs where
its drafts do not help, on CPU: a random DeepSeek V3-shaped checkpoint with a prediction layer
(random_checkpoint.py's deepseek_mtp: 4 decoder layers at 1024 hidden, MLA, 8 experts; a random layer proposes
tokens the target almost never takes), greedy decoding of --batch random 32-id prompts, EOS ignored:

  off      plain decoding
  mirror   NEXTN with every step stepped aside (as --speculative-disable-by-batch-size or the cost rule does): the
           layer still runs behind every step (its K/V stays whole), nothing is proposed
  draft    NEXTN drafting --num-steps tokens every step, each verified and (on random weights) rejected

Each setting runs in its own child process with --threads torch threads, interleaved over --rounds; reported:
medians of decode tokens per second of wall time and per CPU second, each setting's ratio to off, identical ids.
A trained layer's acceptance (what would make drafting pay) is not measured here: no real checkpoint fits.

    python benchmarks/bench_nextn.py                          # batch 1 and 4, 2 rounds
    python benchmarks/bench_nextn.py --batch 1 --rounds 3 --new-tokens 64
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from bench_common import in_child

SETTINGS = ("off", "mirror", "draft")


def measure(model: str, setting: str, batch: int, new_tokens: int, steps: int, threads: int, q) -> None:
    import torch

    from radixlang_runtime import Engine

    torch.set_num_threads(threads)
    kw = {} if setting == "off" else {"speculative_algorithm": "NEXTN", "speculative_num_steps": steps}
    eng = Engine(model, max_total_tokens=8192, **kw)
    if setting == "draft":  # every draft verified (the cost rule would step aside on random weights)
        eng._loop.call(lambda s: setattr(s.drafts.drafter.cfg, "row_cost", 0.0))
    elif setting == "mirror":  # every step stepped aside, as the batch-size gate does (Drafts.speculate)
        eng._loop.call(lambda s: setattr(s.drafts, "speculate", lambda batch_size: False))
    rng = random.Random(5)
    ids = [[rng.randrange(100, 49000) for _ in range(32)] for _ in range(batch)]
    sp = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    eng.generate(input_ids=ids, sampling_params={**sp, "max_new_tokens": 1})  # prompts cached; warm-up
    w0, c0 = time.perf_counter(), time.process_time()
    outs = eng.generate(input_ids=ids, sampling_params=sp)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    n = sum(o["meta_info"]["completion_tokens"] for o in outs)
    stats = eng.get_stats()
    eng.shutdown()
    q.put({"wall": n / wall, "cpu": n / cpu, "ids": [o["output_ids"] for o in outs],
           "drafted": stats["spec_draft_tokens"], "accepted": stats["spec_accepted_tokens"]})


def main() -> None:
    from random_checkpoint import build

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="1,4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--num-steps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--random-dir", default="/tmp/radixlang-random")
    a = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)  # the children's OpenMP pool
    model = build("deepseek_mtp", os.path.join(a.random_dir, "deepseek_mtp"))
    print(f"{model}: {a.new_tokens} new tokens, {a.threads} thread(s), NEXTN {a.num_steps} step(s), "
          f"medians of {a.rounds} interleaved rounds")
    print(f"{'batch':>5} {'setting':>7} {'tok/s':>7} {'ratio':>6} {'tok/cpu-s':>10} {'ratio':>6} "
          f"{'accepted/drafted':>17} {'same ids':>9}")
    for b in (int(x) for x in a.batch.split(",")):
        got: dict[str, list[dict]] = {s: [] for s in SETTINGS}
        for _ in range(a.rounds):
            for s in SETTINGS:
                got[s].append(in_child(measure, model, s, b, a.new_tokens, a.num_steps, a.threads))
        med = {s: (statistics.median(r["wall"] for r in rs), statistics.median(r["cpu"] for r in rs))
               for s, rs in got.items()}
        for s in SETTINGS:
            r = got[s][-1]
            print(f"{b:>5} {s:>7} {med[s][0]:>7.1f} {med[s][0] / med['off'][0]:>6.2f} {med[s][1]:>10.1f} "
                  f"{med[s][1] / med['off'][1]:>6.2f} {r['accepted']:>8}/{r['drafted']:<8} "
                  f"{str(r['ids'] == got['off'][-1]['ids']):>9}", flush=True)


if __name__ == "__main__":
    main()
