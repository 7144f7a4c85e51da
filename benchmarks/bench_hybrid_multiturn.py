"""Multi-turn chat on a hybrid model (Qwen3.5's layout: Gated DeltaNet + full attention) and on a full-attention
model of the same size (the small Llama), each with the prefix cache on and off.

Workload (token ids, greedy, EOS ignored): --convs conversations share a --system-token system prompt; each
turn sends the whole history (system, the earlier user turns and answers) + --user-tokens new tokens and gets
--new-tokens back; the turns of all conversations go together, one turn after the other. With the cache, a
full-attention model continues each turn from the previous one's history (K/V); the hybrid model from the
deepest state snapshot (the previous turn's finish, the shared system prompt's last page boundary once two
prompts diverged there: docs/HYBRID_MODELS.md). Reported per setting: wall time of all turns, prefill tokens
computed and served from the cache, the speed-up of cache on over cache off, the state snapshots held at the
end and their memory. Each setting runs in its own child process; the random checkpoints are built once under --dir.

    python benchmarks/bench_hybrid_multiturn.py
    python benchmarks/bench_hybrid_multiturn.py --convs 8 --turns 6
"""

from __future__ import annotations

import argparse
import os
import random
import time

from bench_common import in_child
from random_checkpoint import build


def run(model_dir: str, cache: bool, a: argparse.Namespace, q) -> None:
    from radixlang_runtime import Engine

    rng = random.Random(0)
    system = [rng.randrange(100, 40000) for _ in range(a.system_tokens)]
    histories = [system + [rng.randrange(100, 40000) for _ in range(a.user_tokens)] for _ in range(a.convs)]
    sp = {"max_new_tokens": a.new_tokens, "min_new_tokens": a.new_tokens, "temperature": 0, "ignore_eos": True}
    with Engine(model_dir, dtype="float32", disable_radix_cache=not cache, max_total_tokens=32768) as eng:
        eng.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 1})  # warm
        eng.flush_cache()
        before = eng.get_stats()
        t0 = time.perf_counter()
        for _ in range(a.turns):
            outs = eng.generate(input_ids=histories, sampling_params=sp)
            histories = [h + o["output_ids"] + [rng.randrange(100, 40000) for _ in range(a.user_tokens)]
                         for h, o in zip(histories, outs)]
        wall = time.perf_counter() - t0
        after = eng.get_stats()
    pool = after.get("state_pool", {})
    q.put({"wall_s": wall,
           "computed": after["prefill_tokens_computed"] - before["prefill_tokens_computed"],
           "cached": after["prefill_tokens_cached"] - before["prefill_tokens_cached"],
           "snapshots": pool.get("snapshots_held", 0),
           "snapshot_mib": pool.get("snapshots_held", 0) * pool.get("state_bytes_per_slot", 0) / 2**20})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--convs", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=512)
    ap.add_argument("--user-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--models", nargs="+", default=["qwen3_5", "llama"], choices=["qwen3_5", "llama"])
    ap.add_argument("--dir", default=os.path.join("/tmp", "radixlang-random"))
    a = ap.parse_args()
    print(f"{a.convs} conversations x {a.turns} turns, system {a.system_tokens}, user {a.user_tokens}, "
          f"answers {a.new_tokens} tokens (float32)")
    print(f"{'model':10} {'cache':5} {'wall s':>8} {'computed':>9} {'cached':>7} {'speed-up':>8} "
          f"{'snapshots held':>14} {'MiB':>6}")
    for name in a.models:
        path = build(name, os.path.join(a.dir, name))
        off = in_child(run, path, False, a)
        on = in_child(run, path, True, a)
        for label, r in (("off", off), ("on", on)):
            speed = off["wall_s"] / r["wall_s"]
            print(f"{name:10} {label:5} {r['wall_s']:8.2f} {r['computed']:9d} {r['cached']:7d} {speed:7.2f}x "
                  f"{r['snapshots']:14d} {r['snapshot_mib']:6.2f}")


if __name__ == "__main__":
    main()
