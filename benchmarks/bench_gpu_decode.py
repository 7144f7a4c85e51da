"""Decode with CUDA graphs on and off, end to end through the Engine, on a Llama-3-8B-shaped model (32 layers,
hidden 4096, 32 query / 8 KV heads, intermediate 14336, vocabulary 128256) whose random bf16 weights are made on
the GPU (nothing downloaded; the embedded tokenizer's files borrowed, RADIXLANG_TOKENIZER_DIR on the GPU image).

Per mode (one child process each: the whole GPU to itself): bench_offline's W1 (64 prompts x 256 tokens -> 128
new) and W2 (1 x 32 -> 256 new) in tokens/s, then decode at batch 1 / 16 / 64 (prompts of 32 tokens): ms per step
from two runs of 1 and 1 + N new tokens, tokens/s, and the share of the HBM roofline: (weights read + the KV read
at the step's mean length) / step time / peak bandwidth, the peak from a measured device-to-device copy.

    python benchmarks/bench_gpu_decode.py --json out.json          # the GPU machine (benchmarks/gpu_check.sh)
    python benchmarks/bench_gpu_decode.py --shape tiny --device cpu --modes emulate,off --quick   # a CPU check
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time
from typing import Any, Optional

# the checkout's packages, also where nothing is installed (the GPU image: benchmarks/gpu_check.sh)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128256),
}
MODES = ("on", "off", "emulate")  # graphs captured (CUDA), eager decode, the graph path run eagerly (CPU)
BATCHES = (1, 16, 64)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def llama_config(shape: str, context: int) -> dict[str, Any]:
    """config.json of a LlamaForCausalLM of `shape` (Llama 3's rope theta and norm epsilon)."""
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}: choose one of {', '.join(SHAPES)}")
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **SHAPES[shape], "hidden_act": "silu",
            "max_position_embeddings": context, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}


def tensor_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every weight of the checkpoint, by its Hugging Face name."""
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    dim = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * dim
    out = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,), "lm_head.weight": (vocab, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                    p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                    p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                    p + "mlp.down_proj.weight": (h, inter), p + "input_layernorm.weight": (h,),
                    p + "post_attention_layernorm.weight": (h,)})
    return out


def weight_bytes_read(cfg: dict[str, Any]) -> int:
    """Bytes of bf16 weights a decode step reads: all but the embedding table (only the batch's rows)."""
    total = 0
    for name, shape in tensor_shapes(cfg).items():
        if name != "model.embed_tokens.weight":
            n = 1
            for d in shape:
                n *= d
            total += 2 * n
    return total


def kv_bytes_per_token(cfg: dict[str, Any]) -> int:
    dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * dim * 2  # K and V, bf16


def build_checkpoint(out_dir: str, shape: str, device: str, context: int = 4096, shard_bytes: int = 2 << 30) -> str:
    """config.json, random bf16 safetensors shards (made on `device`: std 0.02 linears, unit norms) and the
    embedded tokenizer's files in out_dir; returns it."""
    import torch
    from safetensors.torch import save_file

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    cfg = llama_config(shape, context)
    os.makedirs(out_dir, exist_ok=True)
    gen = torch.Generator(device=device).manual_seed(0)
    shard: dict[str, Any] = {}
    index: dict[str, str] = {}
    size = 0

    def flush() -> None:
        nonlocal shard, size
        name = f"model-{len(set(index.values())):05d}.safetensors"
        save_file(shard, os.path.join(out_dir, name))
        index.update({k: name for k in shard})
        shard, size = {}, 0

    for name, dims in tensor_shapes(cfg).items():
        if len(dims) == 1:
            t = torch.ones(dims, dtype=torch.bfloat16, device=device)
        else:
            t = torch.randn(dims, generator=gen, device=device, dtype=torch.float32).mul_(0.02).to(torch.bfloat16)
        shard[name] = t.cpu()
        size += t.numel() * 2
        if size >= shard_bytes:
            flush()
    if shard:
        flush()
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": index}, f)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    src = embedded_tokenizer_dir()
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), os.path.join(out_dir, name))
    return out_dir


def peak_copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """Bytes/s of a device-to-device copy (read + write counted), best of 10."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(10):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def workloads(quick: bool) -> dict[str, dict[str, Any]]:
    """bench_offline's W1 / W2 (ids below the embedded tokenizer's 49,152), smaller with quick."""
    rng = random.Random(0)
    n1, l1, o1 = (4, 16, 4) if quick else (64, 256, 128)
    n2, o2 = (8, 8) if quick else (32, 256)
    return {"W1": {"ids": [[rng.randrange(100, 49000) for _ in range(l1)] for _ in range(n1)], "new": o1},
            "W2": {"ids": [[rng.randrange(100, 49000) for _ in range(n2)]], "new": o2}}


def timed(eng: Any, ids: list[list[int]], new: int) -> float:
    eng.flush_cache()
    sp = {"max_new_tokens": new, "min_new_tokens": new, "temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    outs = eng.generate(input_ids=ids, sampling_params=[dict(sp) for _ in ids])
    dt = time.perf_counter() - t0
    if any(len(o["output_ids"]) != new for o in outs):
        raise RuntimeError(f"a request returned other than {new} tokens")
    return dt


def decode_case(eng: Any, cfg: dict[str, Any], batch: int, steps: int, peak: float) -> dict[str, float]:
    """Batch `batch` of 32-token prompts: ms per decode step from runs of 1 and 1 + steps new tokens."""
    rng = random.Random(batch)
    ids = [[rng.randrange(100, 49000) for _ in range(32)] for _ in range(batch)]
    t1 = min(timed(eng, ids, 1) for _ in range(2))
    tn = min(timed(eng, ids, 1 + steps) for _ in range(2))
    step = max(tn - t1, 1e-9) / steps
    kv = batch * (32 + steps / 2) * kv_bytes_per_token(cfg)
    return {"batch": batch, "ms_per_step": 1e3 * step, "tok_s": batch / step,
            "hbm_share": (weight_bytes_read(cfg) + kv) / step / peak if peak else None}


def engine_args(mode: str, device: str, max_bs: int, context: int) -> dict[str, Any]:
    base = dict(device=device, dtype="bfloat16", context_length=context, max_running_requests=max_bs,
                max_total_tokens=64 * 512 + 64 * 384)
    if mode == "on":
        return {**base, "cuda_graph_max_bs": max_bs}
    if mode == "emulate":
        return {**base, "cuda_graph_emulate": True, "cuda_graph_max_bs": max_bs}
    return {**base, "disable_cuda_graph": True} if device == "cuda" else base


def run_mode(model_dir: str, mode: str, a: argparse.Namespace, peak: float, out: Any) -> None:
    """One Engine in this (child) process: the workloads and the decode batches; the results on `out`."""
    from radixlang_runtime import Engine

    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    max_bs = max(a.batches)
    t0 = time.perf_counter()
    eng = Engine(model_dir, **engine_args(mode, a.device, max_bs, a.context))
    res: dict[str, Any] = {"mode": mode, "start_s": time.perf_counter() - t0}
    try:
        res["cuda_graph"] = eng.get_stats()["cuda_graph"]
        timed(eng, [[5] * 16], 4)  # warm-up (Triton's compiles on the eager path)
        for name, wl in workloads(a.quick).items():
            dt = timed(eng, wl["ids"], wl["new"])
            res[name + "_tok_s"] = len(wl["ids"]) * wl["new"] / dt
        res["decode"] = [decode_case(eng, cfg, b, a.steps, peak) for b in a.batches]
        res["cuda_graph"] = eng.get_stats()["cuda_graph"]
    finally:
        eng.shutdown()
    out.put(res)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--modes", default="on,off", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)), help="decode batch sizes")
    ap.add_argument("--steps", type=int, default=64, help="decode steps timed per batch")
    ap.add_argument("--context", type=int, default=4096, help="the model's context (sizes the graphs' grids)")
    ap.add_argument("--quick", action="store_true", help="small W1 / W2 (the CPU check)")
    ap.add_argument("--model-dir", default=None, help="where the checkpoint is built (default: a temp dir)")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args(argv)
    a.modes = a.modes.split(",")
    bad = [m for m in a.modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {', '.join(bad)}: choose from {', '.join(MODES)}")
    if a.device == "cpu" and "on" in a.modes:
        ap.error("mode on captures CUDA graphs: use --device cuda (or mode emulate on the CPU)")
    try:
        a.batches = [int(b) for b in a.batches.split(",")]
    except ValueError:
        ap.error(f"--batches must be comma-separated integers; got {a.batches!r}")
    if not a.batches or min(a.batches) < 1 or a.steps < 1:
        ap.error("--batches and --steps must be >= 1")
    return a


def report(results: list[dict[str, Any]], peak: float) -> None:
    print(f"peak copy bandwidth {peak / 1e9:.0f} GB/s")
    for r in results:
        g = r["cuda_graph"]
        print(f"graphs {r['mode']:<8} start {r['start_s']:.1f} s, capture {g['capture_s']:.2f} s "
              f"{g['capture_bytes'] / 2**20:.0f} MiB ({g['mode']}); W1 {r['W1_tok_s']:.1f} tok/s, "
              f"W2 {r['W2_tok_s']:.1f} tok/s")
        for d in r["decode"]:
            share = f"{100 * d['hbm_share']:.1f}% of HBM roofline" if d["hbm_share"] else ""
            print(f"    batch {d['batch']:>3}: {d['ms_per_step']:.2f} ms/step, {d['tok_s']:.1f} tok/s {share}")


def flashinfer_line() -> str:
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return "flashinfer: not importable here; skipped"
    return "flashinfer: importable, but the runtime has no FlashInfer attention backend to compare; skipped"


def child_result(p: Any, q: Any) -> Optional[dict[str, Any]]:
    """The child's results, read before joining it (a queue's data can hold its exit); None once it died
    without them."""
    import queue

    while True:
        try:
            return q.get(timeout=1.0)
        except queue.Empty:
            if not p.is_alive() and q.empty():
                return None


def main(argv: Optional[list[str]] = None) -> int:
    a = parse_args(argv)
    print(flashinfer_line())
    model_dir = a.model_dir or tempfile.mkdtemp(prefix="radixlang-gpu-decode-")
    t0 = time.perf_counter()
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        build_checkpoint(model_dir, a.shape, a.device, a.context)
    print(f"checkpoint {a.shape} in {model_dir}: {time.perf_counter() - t0:.1f} s")
    peak = peak_copy_bandwidth(a.device) if a.device == "cuda" else 0.0
    ctx = mp.get_context("spawn")
    results = []
    for mode in a.modes:
        q = ctx.Queue()
        p = ctx.Process(target=run_mode, args=(model_dir, mode, a, peak, q))
        p.start()
        res = child_result(p, q)
        p.join()
        if res is None:
            print(f"mode {mode}: the child exited with {p.exitcode} before its results")
            return 1
        results.append(res)
    report(results, peak)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"shape": a.shape, "peak_bytes_s": peak, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
