"""One real GGUF file served by `launch_server --model-path FILE`: resident weight memory against the file's size,
and float32 greedy parity with transformers loading the same file (its GGUF loader dequantizes every tensor).

    python benchmarks/check_gguf_file.py FILE [--prompts 4] [--new 32] [--dtype bfloat16]

The server runs in its own process with --dtype float32 (the file's blocks, the default for a .gguf path); the
greedy tokens of each prompt (plain text, tokenized by transformers from the same file; min_new_tokens on both
sides, so EOS is masked alike) are compared token for token. Printed: the file's bytes, the server's weight
bytes (/server_info) and process RSS, their ratios, and per prompt whether the tokens match. Exit status 1 when
a prompt differs or the weights exceed 1.2x the file. `--dtype bfloat16` serves the bf16 model instead (int8
activations, llama.cpp's approximation): the tokens are printed for comparison, only the weights decide.
Not part of CI: it needs a real quantized file (docs/MODELS.md shows how to make one with llama.cpp's
llama-quantize).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import free_port  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village,",
           "Water boils at a temperature of", "The three primary colors are", "import numpy as np\n"]


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def _serve_greedy(path: str, prompts: list[list[int]], new: int, dtype: str) -> tuple[list[list[int]], dict]:
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "radixlang_runtime.launch_server", "--model-path", path,
                             "--dtype", dtype, "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 900
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"launch_server exited with {proc.returncode}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("launch_server not healthy after 900 s")
            time.sleep(1)
        outs = []
        for ids in prompts:
            r = httpx.post(url + "/generate", timeout=600, json={
                "input_ids": ids, "sampling_params": {"max_new_tokens": new, "min_new_tokens": new, "temperature": 0}})
            r.raise_for_status()
            outs.append(r.json()["output_ids"])
        info = httpx.get(url + "/server_info", timeout=30).json()
        info["rss_bytes"] = _rss_bytes(proc.pid)
        return outs, info
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _hf_greedy(path: str, prompts: list[list[int]], new: int) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            g = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, min_new_tokens=new,
                               do_sample=False, pad_token_id=0)
            outs.append(g[0, len(ids):].tolist())
    return outs


def _weights_bytes(info: dict) -> int:
    """The weights' bytes wherever /server_info reports the memory breakdown."""
    def walk(v):
        if isinstance(v, dict):
            if "weights" in v and isinstance(v["weights"], int):
                return v["weights"]
            for x in v.values():
                found = walk(x)
                if found is not None:
                    return found
        if isinstance(v, list):
            for x in v:
                found = walk(x)
                if found is not None:
                    return found
        return None
    found = walk(info)
    if found is None:
        raise RuntimeError("/server_info has no memory breakdown with 'weights'")
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    a = ap.parse_args()
    from transformers import AutoTokenizer

    path = os.path.abspath(a.file)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    prompts = [tok(p)["input_ids"] for p in PROMPTS[:a.prompts]]
    got, info = _serve_greedy(path, prompts, a.new, a.dtype)
    want = _hf_greedy(path, prompts, a.new)
    file_bytes = os.path.getsize(path)
    weights = _weights_bytes(info)
    same = [g == w for g, w in zip(got, want)]
    print(json.dumps({"file": path, "file_bytes": file_bytes, "weights_bytes": weights,
                      "weights_over_file": round(weights / file_bytes, 3), "rss_bytes": info["rss_bytes"],
                      "rss_over_file": round(info["rss_bytes"] / file_bytes, 3), "dtype": a.dtype, "new_tokens": a.new,
                      "prompts_equal": same}, indent=1))
    for p, g, w in zip(PROMPTS, got, want):
        if g != w:
            first = next(i for i, (x, y) in enumerate(zip(g, w)) if x != y)
            print(f"differs at token {first}: {p!r}\n  radixlang    {g}\n  transformers {w}")
    sys.exit(0 if (all(same) or a.dtype != "float32") and weights <= 1.2 * file_bytes else 1)


if __name__ == "__main__":
    main()
