"""Decode rate of a hybrid model (Qwen3.5's layout: Gated DeltaNet + full attention) with the DeltaNet decode in
C (gated_deltanet.c: the states read and written in place) against the torch form (states gathered, torch ops,
scattered back): --batch requests of a --prompt-token prompt, --new-tokens greedy each, float32; decode tok/s =
the batch's new tokens after the first over the time from the first token to the last. The two settings alternate
--rounds times, each run in its own child process (a shared machine's load hits both alike); medians printed.
The random checkpoint (benchmarks/random_checkpoint.py, qwen3_5) is built once under --dir.

    python benchmarks/bench_hybrid_decode.py
    python benchmarks/bench_hybrid_decode.py --batch 8 --new-tokens 64 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench_common import in_child
from random_checkpoint import build


def run(model_dir: str, c_kernel: bool, a: argparse.Namespace, q) -> None:
    from radixlang_runtime import Engine
    from radixlang_runtime.model.models.llama import LlamaForCausalLM
    from radixlang_runtime.model.models.qwen3_next import HybridForCausalLM

    if not c_kernel:  # the norms' C kernels stay; only the DeltaNet decode takes the torch path
        HybridForCausalLM.enable_cpu_ops = LlamaForCausalLM.enable_cpu_ops
    prompts = [[100 + 7 * i + j for j in range(a.prompt_tokens)] for i in range(a.batch)]
    with Engine(model_dir, dtype="float32", max_total_tokens=16384, disable_radix_cache=True) as eng:
        eng.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})  # warm
        path = eng.get_stats()["cpu"]["paths"]["linear_attention"]
        sp = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}
        t0 = time.perf_counter()
        eng.generate(input_ids=prompts, sampling_params=sp)
        prefill = time.perf_counter() - t0
        sp["max_new_tokens"] = a.new_tokens
        t0 = time.perf_counter()
        eng.generate(input_ids=prompts, sampling_params=sp)
        wall = time.perf_counter() - t0
    q.put({"path": path, "tok_s": a.batch * (a.new_tokens - 1) / max(wall - prefill, 1e-9)})


def prefill_rule(lens: list[int], iters: int) -> None:
    """One layer's delta rule over an extend of L tokens, Qwen3.5 / Qwen3-Next-sized heads (Hk 16, Hv 32, 128 x 128):
    the runtime's torch chunk form (l2norm + chunk_rule) vs gdn_ops.gdn_prefill (token after token), interleaved."""
    import torch

    from radixlang_kernels import cpu_ops, gdn_ops
    from radixlang_runtime.model.layers.gated_deltanet import chunk_rule, l2norm

    if cpu_ops.load() is None:
        raise SystemExit("no C kernel library on this machine")
    Hk, Hv, D = 16, 32, 128
    for L in lens:
        mixed = torch.randn(L, (2 * Hk + Hv) * D)
        g, beta = -torch.rand(L, Hv), torch.rand(L, Hv)
        state = torch.randn(1, Hv, D, D)
        one, zero = torch.tensor([L]), torch.tensor([0])

        def torch_chunks():
            q, k, v = mixed.split([Hk * D, Hk * D, Hv * D], dim=-1)
            q = l2norm(q.reshape(L, Hk, D).repeat_interleave(2, dim=1)) * D ** -0.5
            k = l2norm(k.reshape(L, Hk, D).repeat_interleave(2, dim=1))
            return chunk_rule(q.transpose(0, 1), k.transpose(0, 1), v.reshape(L, Hv, D).transpose(0, 1),
                              g.transpose(0, 1), beta.transpose(0, 1), state[0].clone())

        def c_tokens():
            return gdn_ops.gdn_prefill(mixed, g, beta, state.clone(), zero, zero, one, Hk, D)

        ta, tb = [], []
        for _ in range(iters):
            for fn, out in ((c_tokens, ta), (torch_chunks, tb)):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
        c_ms, t_ms = statistics.median(ta) * 1e3, statistics.median(tb) * 1e3
        print(f"prefill L {L:5d}: C token after token {c_ms:8.2f} ms, torch chunks {t_ms:8.2f} ms ({t_ms / c_ms:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=None, help="a hybrid checkpoint directory (default: the random qwen3_5)")
    ap.add_argument("--dir", default=os.path.join("/tmp", "radixlang-random"))
    ap.add_argument("--prefill-lens", type=int, nargs="*", default=None,
                    help="instead: one layer's delta rule over extends of these lengths, C vs torch chunks")
    a = ap.parse_args()
    if a.prefill_lens:
        return prefill_rule(a.prefill_lens, a.rounds)
    path = a.model or build("qwen3_5", os.path.join(a.dir, "qwen3_5"))
    rates: dict[bool, list[float]] = {True: [], False: []}
    names = {}
    for _ in range(a.rounds):
        for c in (True, False):
            r = in_child(run, path, c, a)
            rates[c].append(r["tok_s"])
            names[c] = r["path"]
    print(f"batch {a.batch}, prompt {a.prompt_tokens}, {a.new_tokens} new tokens, float32, {a.rounds} rounds")
    for c in (True, False):
        print(f"{names[c]:40} decode {statistics.median(rates[c]):8.1f} tok/s  "
              f"(runs: {', '.join(f'{x:.1f}' for x in rates[c])})")


if __name__ == "__main__":
    main()
