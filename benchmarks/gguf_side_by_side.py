"""One GGUF file, radixlang against llama.cpp's own C++ tools, decode tok/s side by side in one run
(bench_offline.py --peers llamacpp --model-path FILE.gguf).

Decode rates (tokens after the first over their time, as llama.cpp's tools report them):
  W2   one stream: 32 prompt tokens -> 256 new (llama-bench -p 0 -n 256 -d 32: tg256 at depth 32)
  B16  16 streams: 32 prompt tokens each -> 128 new (llama-batched-bench -npp 32 -ntg 128 -npl 16: S_TG)
  B64  64 streams, the same (-npl 64)
  --quick (bench_offline.py): the same streams with fewer new tokens (W2 64, B16 32, B64 16; QUICK_SHAPES)
radixlang: Engine(FILE) in a child process per system and round; a workload's decode rate is
n (new - 1) / (t(new) - t(1)), t(1) the same prompts with one new token (prefill and first token).
Each round runs every system once, A B A B over --runs rounds (the machine's other load moves between
rounds: the 1-minute load average is kept beside every figure). RADIXLANG_CPU_MASK words listed in --masks
run radixlang a second time with that mask (llama.cpp runs as it was built). The tools come from
$LLAMACPP_BIN (default $PEERS_DIR/llamacpp-tools/bin: build steps in docs/BENCHMARKS.md).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import time

from bench_common import in_child

SHAPES = {"W2": (1, 32, 256), "B16": (16, 32, 128), "B64": (64, 32, 128)}
QUICK_SHAPES = {"W2": (1, 32, 64), "B16": (16, 32, 32), "B64": (64, 32, 16)}  # --quick: short rounds


def load1() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def _prompts(n: int, length: int) -> list[list[int]]:
    rng = random.Random(n)
    return [[rng.randrange(100, 49000) for _ in range(length)] for _ in range(n)]


def run_radixlang_decode(path: str, mask: str, shapes: dict, dtype: str, out) -> None:
    """Decode rates of every SHAPES workload on Engine(path, dtype=dtype), with RADIXLANG_CPU_MASK = mask in
    this child."""
    if mask:
        os.environ["RADIXLANG_CPU_MASK"] = mask
    from radixlang_runtime import Engine

    eng = Engine(path, max_running_requests=64, dtype=dtype)
    res = {"dtype": str(eng.runner.dtype).replace("torch.", ""), "cpu": eng.get_stats()["cpu"],
           "weights_bytes": eng.runner.weights_bytes, "file_bytes": os.path.getsize(path)}
    try:
        def timed(ids, new):
            assert eng.flush_cache()
            t = time.perf_counter()
            outs = eng.generate(input_ids=ids, sampling_params={"max_new_tokens": new, "temperature": 0,
                                                                "ignore_eos": True})
            assert all(len(o["output_ids"]) == new for o in outs)
            return time.perf_counter() - t

        for name, (n, length, new) in shapes.items():
            ids = _prompts(n, length)
            timed(ids, 4)  # warm-up at this batch size (first-call costs stay out of the figures)
            load = load1()
            first, full = timed(ids, 1), timed(ids, new)
            res[name] = {"tok_s": n * (new - 1) / (full - first), "load1": load}
    finally:
        eng.shutdown()
    out.put(res)


def _tool(bin_dir: str, name: str, args: list[str]) -> list[dict]:
    cmd = [os.path.join(bin_dir, name), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr[-400:]}")
    text = p.stdout.strip()
    if text.startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def run_llamacpp_tools(path: str, bin_dir: str, threads: int, shapes: dict) -> dict:
    """llama-bench (W2) and llama-batched-bench (B16, B64) on the file: their own decode tok/s."""
    res = {"dtype": "file", "weights_bytes": None, "file_bytes": os.path.getsize(path)}
    n, length, new = shapes["W2"]
    load = load1()
    rows = _tool(bin_dir, "llama-bench", ["-m", path, "-t", str(threads), "-p", "0", "-n", str(new), "-d",
                                          str(length), "-r", "1", "-o", "json"])
    res["W2"] = {"tok_s": float(rows[0]["avg_ts"]), "load1": load}
    for name in ("B16", "B64"):
        n, length, new = shapes[name]
        load = load1()
        ctx = str(n * (length + new) + 256)
        rows = _tool(bin_dir, "llama-batched-bench", ["-m", path, "-t", str(threads), "-c", ctx, "-b", "2048",
                                                      "-ub", "512", "-npp", str(length), "-ntg", str(new),
                                                      "-npl", str(n), "--output-format", "jsonl"])
        res[name] = {"tok_s": float(rows[-1]["speed_tg"]), "load1": load}
    return res


def side_by_side(path: str, runs: int, masks: list[str], threads: int = 2, quick: bool = False,
                 dtype: str = "auto") -> dict:
    """system -> list of per-round results, rounds interleaved A B A B."""
    bin_dir = os.environ.get("LLAMACPP_BIN", os.path.join(os.environ.get("PEERS_DIR", "/tmp/peers"),
                                                          "llamacpp-tools", "bin"))
    shapes = QUICK_SHAPES if quick else SHAPES
    rounds: dict[str, list] = {}
    for r in range(runs):
        for mask in masks:
            name = "radixlang" + (f" mask={mask}" if mask else "")
            rounds.setdefault(name, []).append(in_child(run_radixlang_decode, path, mask, shapes, dtype))
            print(name, json.dumps(rounds[name][-1]), flush=True)
        try:
            rounds.setdefault("llama.cpp", []).append(run_llamacpp_tools(path, bin_dir, threads, shapes))
        except (OSError, RuntimeError) as e:
            rounds.setdefault("llama.cpp", []).append({"error": str(e)})
        print("llama.cpp", json.dumps(rounds["llama.cpp"][-1]), flush=True)
    return rounds


def report(path: str, rounds: dict) -> str:
    lines = [f"file {path} ({os.path.getsize(path) / 1e6:.1f} MB); decode tok/s, medians of "
             f"{max(len(v) for v in rounds.values())} rounds [1-min load averages seen]",
             f"{'system':<30} {'dtype':<9} " + " ".join(f"{w:>22}" for w in SHAPES) + "  weights/file"]
    med = {}
    for name, rs in rounds.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            lines.append(f"{name:<30} error: {rs[-1]['error']}")
            continue
        med[name] = {w: statistics.median(r[w]["tok_s"] for r in ok) for w in SHAPES}
        loads = {w: ",".join(f"{r[w]['load1']:.0f}" for r in ok) for w in SHAPES}
        wb = ok[0]["weights_bytes"]
        lines.append(f"{name:<30} {ok[0]['dtype']:<9} " + " ".join(f"{med[name][w]:>8.1f} [{loads[w]:>11}]"
                                                                   for w in SHAPES)
                     + (f"  {wb / ok[0]['file_bytes']:.3f}" if wb else ""))
    if "llama.cpp" in med:
        for name in [k for k in med if k != "llama.cpp"]:
            lines.append(f"{name} / llama.cpp: " + "  ".join(f"{w} {med[name][w] / med['llama.cpp'][w]:.2f}x"
                                                             for w in SHAPES))
    return "\n".join(lines)
