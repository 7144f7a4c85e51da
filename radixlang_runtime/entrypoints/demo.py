"""Offline demo: the embedded SmolLM2 model under radixlang's Engine, a few chat prompts at once.

    python -m radixlang_runtime.demo [--model-path PATH] [--max-new-tokens N]
"""

from __future__ import annotations

import argparse
import time

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me three tips for writing clean Python code.",
    "Explain what a KV cache is in one paragraph.",
    "What is 17 * 23?",
    "Name the planets of the solar system.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    a = ap.parse_args()

    from radixlang_runtime.entrypoints.engine import Engine

    t0 = time.perf_counter()
    engine = Engine(a.model_path)
    print(f"loaded {engine.served_model_name} ({engine.runner.dtype}, {engine.runner.device}) "
          f"in {time.perf_counter() - t0:.1f}s; KV pool {engine.runner.sizes.num_slots} tokens\n")
    prompts = [engine.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                    add_generation_prompt=True) for q in QUESTIONS]
    try:
        t = time.perf_counter()
        outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": a.max_new_tokens})
        dt = time.perf_counter() - t
        for q, o in zip(QUESTIONS, outs):
            print(f"Q: {q}\nA: {o['text'].strip()}\n   [{o['meta_info']['completion_tokens']} tokens, "
                  f"finish {o['meta_info']['finish_reason']}]\n")
        n = sum(o["meta_info"]["completion_tokens"] for o in outs)
        print(f"{len(prompts)} requests, {n} generated tokens in {dt:.2f}s: {n / dt:.1f} tokens/s")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
