"""llama.cpp's prompt-lookup speculation (llama-cpp-python's LlamaPromptLookupDecoding) on given token ids,
for bench_spec.py --llamacpp. Runs in the peers' venv (../shared/peers/build_llamacpp.sh): it
imports llama_cpp and the standard library only.

Input (a JSON file): {"workloads": {name: [token ids]}, "new_tokens": N}. For each workload, lookup off and on,
--runs timed runs after a warm-up: greedy (temp 0), exactly N tokens (EOS not special: Llama.generate yields
whatever is sampled), one sequence. Decode tok/s = tokens after the first / seconds after the first (the first
token's time is the prompt's evaluation). Output: one JSON line {name: {"off": tok/s, "lookup": tok/s,
"same_ids": bool}} (medians), "same_ids": whether both modes produced the same tokens.

    $PEERS_DIR/venv-llamacpp/bin/python benchmarks/peer_llamacpp_lookup.py --gguf G --ids F --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding


def one_run(llm: Llama, ids: list[int], n: int) -> tuple[float, list[int]]:
    out: list[int] = []
    first = 0.0
    for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        out.append(tok)
        if len(out) == 1:
            first = time.perf_counter()
        if len(out) >= n:
            break
    return (len(out) - 1) / (time.perf_counter() - first), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--ids", required=True, help="JSON: {workloads: {name: ids}, new_tokens: N}")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    with open(a.ids) as f:
        spec = json.load(f)
    n = spec["new_tokens"]
    result: dict = {}
    for mode in ("off", "lookup"):
        draft = LlamaPromptLookupDecoding() if mode == "lookup" else None  # its defaults: what a user gets
        # logits_all with a draft: Llama sizes its score buffer from this argument (n_batch rows without it) while
        # a draft model makes it store every row, which fails on a prompt longer than n_batch (0.3.36)
        llm = Llama(model_path=a.gguf, n_ctx=4096, n_batch=512, n_threads=a.threads, n_threads_batch=a.threads,
                    draft_model=draft, logits_all=draft is not None, verbose=False)
        for name, ids in spec["workloads"].items():
            one_run(llm, ids, 8)  # warm-up
            runs = [one_run(llm, ids, n) for _ in range(a.runs)]
            entry = result.setdefault(name, {})
            entry[mode] = statistics.median(r[0] for r in runs)
            entry[f"{mode}_ids"] = runs[0][1]
        del llm
    for entry in result.values():
        entry["same_ids"] = entry.pop("off_ids") == entry.pop("lookup_ids")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
