"""Multi-head latent attention: KV bytes per token (the pool's latent entry against the expanded keys and values
an MHA cache would hold) and decode tokens / s with the absorbed decode (C kernel, torch) against the expanded
one, on the `deepseek` random checkpoint (random_checkpoint.py), through ModelRunner steps (no scheduler):
--batch requests of --context tokens prefilled, then --steps decode steps per mode, medians of --runs.

  python benchmarks/bench_mla.py --dtype float32 --batch 8 --context 1024 --steps 16

--capacity-mib N instead sizes the pool from a KV budget of N MiB (kv_cache_budget_bytes, as a server does) and
reports the tokens it holds against an expanded MHA cache in the same bytes, then fills it: --batch requests of
one context each, as long as the pool allows (at most the model's max_position_embeddings), prefilled in chunks
and decoded --steps steps, the allocator's free count checked before and after.
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
    ap.add_argument("--capacity-mib", type=int, default=0)
    a = ap.parse_args()
    path = build("deepseek", a.model_dir)
    if a.capacity_mib:
        return capacity(path, a)
    slots = a.batch * (a.context + a.steps * (a.runs * len(MODES) + 1))
    runner = ModelRunner(ServerArgs(model_path=path, dtype=a.dtype, max_total_tokens=slots, context_length=4096,
                                    max_running_requests=a.batch), path)
    cfg, m = runner.cfg, runner.cfg.mla
    per_token = runner.kv_pool.nbytes // runner.kv_pool.num_slots
    elt = torch.empty((), dtype=runner.dtype).element_size()
    expanded = expanded_bytes(runner)
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


def expanded_bytes(runner: ModelRunner) -> int:
    """Bytes per token of the MHA cache the expanded form would keep: every head's key (nope + rope) and value."""
    cfg, m = runner.cfg, runner.cfg.mla
    elt = torch.empty((), dtype=runner.dtype).element_size()
    lanes = m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim
    return cfg.num_hidden_layers * cfg.num_attention_heads * lanes * elt


def capacity(path: str, a: argparse.Namespace) -> None:
    budget = a.capacity_mib << 20
    runner = ModelRunner(ServerArgs(model_path=path, dtype=a.dtype, kv_cache_budget_bytes=budget,
                                    max_running_requests=a.batch), path)
    cfg, pool = runner.cfg, runner.kv_pool
    per_token = pool.nbytes // pool.num_slots
    expanded = expanded_bytes(runner)
    print(f"KV budget {a.capacity_mib} MiB ({a.dtype}): the latent pool holds {pool.num_slots:,} tokens "
          f"({per_token} B each); an expanded MHA cache in the same bytes would hold {budget // expanded:,} "
          f"({expanded} B each), {pool.num_slots / (budget // expanded):.1f}x fewer")
    context = min(cfg.max_position_embeddings - a.steps, (pool.num_slots - a.batch * a.steps) // a.batch)
    chunk = 512
    t0 = time.perf_counter()
    for b in range(a.batch):
        base = b * context
        for c0 in range(0, context, chunk):
            n = min(chunk, context - c0)
            ids = [((base + c0 + i) * 7919) % cfg.vocab_size for i in range(n)]
            runner.run_step(StepInputs("extend", ids, list(range(base + c0, base + c0 + n)), [b], [c0], [n], [],
                                       [n - 1]))
    prefill_s = time.perf_counter() - t0
    rows, lens = list(range(a.batch)), [context] * a.batch
    t0 = time.perf_counter()
    for s in range(a.steps):
        slots = [a.batch * context + s * a.batch + b for b in rows]
        runner.run_step(StepInputs("decode", [7 + b for b in rows], slots, rows, lens, [1] * a.batch, [], rows))
        lens = [n + 1 for n in lens]
    rate = a.batch * a.steps / (time.perf_counter() - t0)
    used = a.batch * (context + a.steps)
    print(f"filled: {a.batch} x {context} context tokens + {a.steps} decode steps = {used:,} of {pool.num_slots:,} "
          f"slots; prefill {prefill_s:.1f} s, decode {rate:.1f} tok/s at that context (absorbed, "
          f"{'C kernel' if runner.model.layers[0].self_attn.use_cpu_kernel else 'torch'})")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
