"""Multi-head latent attention: KV bytes per token (the pool's latent entry against the expanded keys and values
an MHA cache would hold) and decode tokens / s with the absorbed decode (C kernel, torch) against the expanded
one, on the `deepseek` random checkpoint (random_checkpoint.py), through ModelRunner steps (no scheduler):
--batch requests of --context tokens prefilled, then --steps decode steps per mode, medians of --runs.

  python benchmarks/bench_mla.py --dtype float32 --batch 8 --context 1024 --steps 16
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from random_checkpoint import build
from radixlang_runtime.model.executor.runner import ModelRunner, StepInputs
from radixlang_runtime.server_args import ServerArgs


MODES = {"absorbed, C kernel": (True, True), "absorbed, torch": (True, False), "expanded": (False, False)}


def decode_rate(runner: ModelRunner, batch: int, context: int, steps: int, mode: str) -> float:
    for layer in runner.model.layers:
        layer.self_attn.absorbed, layer.self_attn.use_cpu_kernel = MODES[mode]
    rows = list(range(batch))
    lens = [context] * batch
    t0 = time.perf_counter()
    for s in range(steps):
        slots = [batch * context + s * batch + b for b in rows]
        runner.run_step(StepInputs("decode", [7 + b for b in rows], slots, rows, lens, [1] * batch, [], rows))
        lens = [n + 1 for n in lens]
    return batch * steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir",
                    default=os.path.join(os.path.expanduser("~"), ".cache", "radixlang", "rand-deepseek"))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    path = build("deepseek", a.model_dir)
    slots = a.batch * (a.context + a.steps * (a.runs * len(MODES) + 1))
    runner = ModelRunner(ServerArgs(model_path=path, dtype=a.dtype, max_total_tokens=slots, context_length=4096,
                                    max_running_requests=a.batch), path)
    cfg, m = runner.cfg, runner.cfg.mla
    per_token = runner.kv_pool.nbytes // runner.kv_pool.num_slots
    elt = torch.empty((), dtype=runner.dtype).element_size()
    expanded = cfg.num_hidden_layers * cfg.num_attention_heads * (
        m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) * elt
    print(f"KV bytes / token: latent {per_token} (({m.kv_lora_rank} + {m.qk_rope_head_dim}) x "
          f"{cfg.num_hidden_layers} layers x {elt} B), expanded MHA {expanded} ({per_token / expanded:.3f}x)")
    n = a.batch * a.context
    ids = [(i * 7919) % cfg.vocab_size for i in range(n)]
    for b in range(a.batch):  # prefill every request (one step each)
        runner.run_step(StepInputs("extend", ids[b * a.context:(b + 1) * a.context],
                                   list(range(b * a.context, (b + 1) * a.context)), [b], [0], [a.context], [],
                                   [a.context - 1]))
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(a.runs):
        for mode in MODES:
            rates[mode].append(decode_rate(runner, a.batch, a.context, a.steps, mode))
    for mode, r in rates.items():
        print(f"decode {mode}: {statistics.median(r):.1f} tok/s (batch {a.batch}, context {a.context}, {a.dtype}; "
              f"runs {[round(x, 1) for x in r]})")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
