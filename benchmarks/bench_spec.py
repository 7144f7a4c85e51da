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

--llamacpp: after the table, llama.cpp's prompt lookup (llama-cpp-python's LlamaPromptLookupDecoding, its
defaults; benchmarks/peer_llamacpp_lookup.py in the peers' venv from ../shared/peers/build_llamacpp.sh, the
BF16 GGUF from its make_gguf.py: the same weights) on the copy workloads at batch 1, on the same token ids, the
same thread count and number of new tokens; reported beside NGRAM's tok/s of the table, with the ratio.

    python benchmarks/bench_spec.py --batch-sizes 1 --workloads code_edit,quotes,json_extract --llamacpp

--standalone: STANDALONE instead (docs/SPECULATIVE.md): the target (the embedded model, --dtype: the CPU
default or float32) drafted by its own .gguf's Q4_1 blocks (--quantization gguf as the draft) on W2 (the 32
ids of ../shared/peers/workloads.py, seed 3, 256 new tokens), per --num-steps; reported: median decode
tok/s off and on, the ratio and the accept length (tokens per verification step).

    python benchmarks/bench_spec.py --standalone --cpu-time --num-steps 2,4
    python benchmarks/bench_spec.py --standalone --num-steps 3 --standalone-batch 32 --new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
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
    step_cost = eng.get_stats().get("spec_step_cost")  # the cost rule's fit per batch size regime (spec_cost.py)
    eng.shutdown()
    q.put({"wall": statistics.median(walls[1:]), "cpu": statistics.median(cpus[1:]), "drafted": drafted,
           "accepted": accepted, "step_cost": step_cost})


def step_cost(threads: int, q) -> None:
    """CPU time of one decode step of M rows (each a request at context 256), M = 1 .. 64."""
    import torch

    from radixlang_runtime.model.loader.resolve import resolve_model_dir
    from radixlang_runtime.model.executor.runner import ModelRunner, StepInputs
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


def w2_ids() -> list[int]:
    """W2 of ../shared/peers/workloads.py: numpy default_rng(3).integers(100, 49000, size=32)."""
    import numpy as np

    return [int(x) for x in np.random.default_rng(3).integers(100, 49000, size=32)]


def measure_standalone(steps: int, dtype: str, new_tokens: int, runs: int, cpu_time: bool, batch: int, q) -> None:
    """steps 0: no speculation; else STANDALONE with the Q4_1 self-draft and `steps` draft tokens a step. batch > 1:
    W2 and batch - 1 prompts of 32 random ids (seed 7), submitted together."""
    import torch

    from radixlang_runtime import Engine
    from radixlang_runtime.model.loader.resolve import embedded_gguf_path

    if cpu_time:
        torch.set_num_threads(1)
    clock = time.process_time if cpu_time else time.perf_counter
    kw = {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": embedded_gguf_path(),
          "speculative_draft_model_quantization": "gguf", "speculative_num_steps": steps} if steps else {}
    eng = Engine(max_total_tokens=max(4096, batch * (64 + new_tokens) * 2), dtype=dtype, **kw)
    rng = random.Random(7)
    ids = w2_ids() if batch == 1 else [w2_ids()] + [[rng.randrange(100, 49000) for _ in range(32)]
                                                    for _ in range(batch - 1)]
    sp = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    eng.generate(input_ids=ids, sampling_params={**sp, "max_new_tokens": 1})  # prompt cached; warm-up
    rates, outs = [], None
    for _ in range(runs):
        t0 = clock()
        out = eng.generate(input_ids=ids, sampling_params=sp)
        outs_b = out if batch > 1 else [out]
        rates.append(sum(o["meta_info"]["completion_tokens"] for o in outs_b) / (clock() - t0))
        outs = [o["output_ids"] for o in outs_b]
    stats = eng.get_stats()
    eng.shutdown()
    q.put({"tok_s": statistics.median(rates), "ids": outs, "dtype": stats["cpu"]["dtype"],
           "accept": (stats["spec_accept_length"] or {}).get("mean_accept_length", 0.0)})


def main_standalone(a) -> None:
    unit = "tok/cpu-s" if a.cpu_time else "tok/s"
    b = a.standalone_batch
    off = in_child(measure_standalone, 0, a.dtype, a.new_tokens, a.runs, a.cpu_time, b)
    what = "W2" if b == 1 else f"W2 + {b - 1} random prompts (batch {b})"
    print(f"{what}, target {off['dtype']}, draft: the same .gguf's Q4_1 blocks; off: {off['tok_s']:.1f} {unit}")
    print(f"{'steps':>5} {'STANDALONE ' + unit:>20} {'ratio':>6} {'accept length':>14} {'same ids':>9}")
    for steps in (int(x) for x in a.num_steps.split(",")):
        on = in_child(measure_standalone, steps, a.dtype, a.new_tokens, a.runs, a.cpu_time, b)
        print(f"{steps:>5} {on['tok_s']:>20.1f} {on['tok_s'] / off['tok_s']:>6.2f} {on['accept']:>14.2f} "
              f"{str(on['ids'] == off['ids']):>9}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--batch-sizes", default="1,4")
    ap.add_argument("--workloads", default="code_edit,quotes,json_extract,free")
    ap.add_argument("--w1", action="store_true", help="allow the W1 workload (64 prompts; use --batch-sizes 64)")
    ap.add_argument("--standalone-batch", type=int, default=1,
                    help="--standalone: requests submitted together (W2 + random 32-id prompts)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--step-cost", action="store_true", help="only the decode step's cost vs rows")
    ap.add_argument("--standalone", action="store_true", help="STANDALONE with the Q4_1 self-draft on W2")
    ap.add_argument("--num-steps", default="2,4", help="--standalone: draft steps to measure")
    ap.add_argument("--dtype", default="auto", help="--standalone: the target's dtype")
    ap.add_argument("--cpu-time", action="store_true", help="--standalone: one torch thread; tokens per CPU second")
    ap.add_argument("--llamacpp", action="store_true", help="also llama.cpp's prompt lookup on the copy workloads, b 1")
    ap.add_argument("--peers-dir", default=os.environ.get("PEERS_DIR", "/tmp/peers"),
                    help="--llamacpp: where build_llamacpp.sh put venv-llamacpp and gguf/")
    a = ap.parse_args()
    if a.standalone:
        if a.cpu_time:
            os.environ["OMP_NUM_THREADS"] = "1"  # the children's OpenMP pool (spawned processes inherit it)
        if a.new_tokens == 96:
            a.new_tokens = 256  # W2's length
        main_standalone(a)
        return
    os.environ["OMP_NUM_THREADS"] = str(a.threads)  # the children's OpenMP pool (spawned processes inherit it)
    if a.step_cost:
        cost = in_child(step_cost, a.threads)
        for M, t in cost.items():
            print(f"rows {M:3d}: {t * 1e3:7.2f} ms  ({t * 1e3 / M:5.2f} ms a row)")
        return
    print(f"{'workload':<13} {'batch':>5} {'off tok/s':>10} {'NGRAM tok/s':>12} {'ratio':>6} {'off tok/cpu-s':>14} "
          f"{'NGRAM tok/cpu-s':>16} {'ratio':>6} {'accepted/drafted':>17}")
    ngram_b1: dict[str, float] = {}  # copy workload -> NGRAM tok/s at batch 1 (for --llamacpp)
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
            if b == 1 and name in COPY:
                ngram_b1[name] = on["wall"]
            if on.get("step_cost"):  # NGRAM's measured step cost: per regime a, b (ms) and the ratio b / a used
                fits = [f"batch {k}+: {v['a_ms']:.1f} + {v['b_ms']:.2f} M ms (ratio {v['ratio']:.3f}; tok/s plain "
                        f"{v['tok_s']['plain']} drafted {v['tok_s']['drafted']}{'' if v['drafts_pay'] else ': VETO'})"
                        for k, v in on["step_cost"].items()]
                print(f"{'':<13} step cost: " + ", ".join(fits), flush=True)
    if a.llamacpp:
        compare_llamacpp(a, ngram_b1)


def compare_llamacpp(a, ngram_b1: dict[str, float]) -> None:
    """llama.cpp's prompt lookup on the same ids (the embedded tokenizer, as Engine.generate encodes a prompt)."""
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    if not ngram_b1:
        raise SystemExit("--llamacpp compares the copy workloads at batch 1: include them and batch size 1")
    py = os.path.join(a.peers_dir, "venv-llamacpp", "bin", "python")
    gguf = os.path.join(a.peers_dir, "gguf", "SmolLM2-135M-Instruct.BF16.gguf")
    for path in (py, gguf):
        if not os.path.exists(path):
            raise SystemExit(f"--llamacpp: {path} is missing (../shared/peers/build_llamacpp.sh, then make_gguf.py)")
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    ids = {name: tok.encode(prompts_for(name, 1, a.new_tokens)["prompt"][0], add_special_tokens=False)
           for name in ngram_b1}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"workloads": ids, "new_tokens": a.new_tokens}, f)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_llamacpp_lookup.py")
    out = subprocess.run([py, script, "--gguf", gguf, "--ids", f.name, "--runs", str(a.runs), "--threads",
                          str(a.threads)], capture_output=True, text=True, timeout=3600, check=True)
    os.unlink(f.name)
    peer = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\nllama.cpp (BF16 GGUF, {a.threads} thread(s), LlamaPromptLookupDecoding defaults), batch 1, decode tok/s")
    print(f"{'workload':<13} {'llama.cpp':>10} {'+lookup':>8} {'same ids':>9} {'ours NGRAM':>11} {'ours / lookup':>14}")
    for name, tps in ngram_b1.items():
        p = peer[name]
        print(f"{name:<13} {p['off']:>10.1f} {p['lookup']:>8.1f} {str(p['same_ids']):>9} {tps:>11.1f} "
              f"{tps / p['lookup']:>14.2f}", flush=True)


if __name__ == "__main__":
    main()
