"""Constrained decoding costs on the embedded SmolLM2 tokenizer:
- compile time per grammar: cold (in a warm worker process, no cache), then cached (LRU hit);
- the batched mask per step at batch 32 (CPU; CUDA too when present), per-state tensors cached;
- jump-forward: forward passes per output with it on vs off, for a few JSON outputs.

    python benchmarks/bench_constrained.py [--skip-json-object]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch
from tokenizers import Tokenizer

from radixlang_runtime.constrained.cache import GrammarCacheConfig, GrammarCompiler
from radixlang_runtime.constrained.jump_forward import forced_tokens
from radixlang_runtime.constrained.mask import mask_logits
from radixlang_runtime.constrained.spec import GrammarSpec
from radixlang_runtime.constrained.state import GrammarState
from radixlang_runtime.constrained.vocab import vocab_from_tokenizer
from radixlang_runtime.model.resolve import resolve_model_dir

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}, "role": {"enum": ["admin", "user"]},
    "tags": {"type": "array", "items": {"type": "string"}}, "active": {"type": "boolean"}},
    "required": ["name", "age", "role", "tags", "active"]}
TOOL = {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {
    "type": "object", "properties": {"location": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["location", "unit"]}}, "required": ["name", "arguments"]}
GRAMMARS = {
    "phone regex": GrammarSpec.from_regex(r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
    "email regex": GrammarSpec.from_regex(r"[a-z0-9._%+-]{1,32}@[a-z0-9.-]{1,32}\.[a-z]{2,6}"),
    "dtype float": GrammarSpec.from_dtype("float"),
    "person schema": GrammarSpec.from_json_schema(PERSON),
    "tool-call schema": GrammarSpec.from_json_schema(TOOL),
    "enum x 10,000": GrammarSpec.from_json_schema({"enum": [f"value_{i}" for i in range(10_000)]}),
    "json_object": GrammarSpec.json_object(),
}
OUTPUTS = [
    (TOOL, {"name": "get_weather", "arguments": {"location": "San Francisco, CA", "unit": "celsius"}}),
    (PERSON, {"name": "Ada Lovelace", "age": 36, "role": "admin", "tags": ["math", "engines"], "active": True}),
]


def bench_compile(compiler: GrammarCompiler, skip: set[str]) -> dict[str, tuple[float, float]]:
    out = {}
    for name, spec in GRAMMARS.items():
        if name in skip:
            continue
        t0 = time.perf_counter()
        h = compiler.submit(spec)
        status = h.wait(compiler.config.timeout_s + 30)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiler.submit(spec).poll()
        cached = time.perf_counter() - t0
        extra = f", index {h.grammar.index_nbytes / 1e6:.1f} MB" if status == "ready" else f": {h.error}"
        print(f"  {name:18s} cold {cold * 1e3:8.1f} ms   cached {cached * 1e6:6.1f} us{extra}")
        out[name] = (cold, cached)
    return out


def bench_mask(compiler: GrammarCompiler, device: torch.device, batch: int = 32) -> None:
    grammars = [compiler.submit(GRAMMARS[n]).grammar for n in ("person schema", "tool-call schema", "email regex")]
    rng = random.Random(0)
    states = []
    for i in range(batch):
        gs = GrammarState(grammars[i % len(grammars)], [2])
        for _ in range(rng.randrange(0, 15)):
            ids = gs.allowed().ids
            if len(ids) == 0:
                break
            gs.advance(int(rng.choice(ids)))
        states.append(gs)
    width = grammars[0].vocab.logits_width
    logits = torch.randn(batch, width, device=device)  # [B, V]
    mask_logits(logits, list(range(batch)), states)  # per-state tensors built once
    times = []
    for _ in range(50):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        mask_logits(logits, list(range(batch)), states)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    dense = sum(len(s.allowed().ids) * 16 > width for s in states)
    print(f"  {device.type}: batch {batch} x {width} ({dense} dense rows): min {min(times) * 1e3:.2f} ms, "
          f"median {statistics.median(times) * 1e3:.2f} ms per step")


def bench_jump_forward(compiler: GrammarCompiler, encode) -> None:
    for schema, value in OUTPUTS:
        g = compiler.submit(GrammarSpec.from_json_schema(schema))
        g.wait(60)
        text = json.dumps(value)
        target = encode(text)
        gs = GrammarState(g.grammar, [2])
        passes, out = 0, forced_tokens(gs)
        while len(out) < len(target):
            passes += 1  # the model samples target[len(out)]
            assert gs.advance(target[len(out)])
            out.append(target[len(out)])
            out += forced_tokens(gs)
        assert out == target
        print(f"  {text[:50]:50s} {len(target)} tokens: {len(target)} passes off, {passes} on "
              f"({gs.num_forced} forced)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-json-object", action="store_true")
    args = ap.parse_args()
    tok = Tokenizer.from_file(os.path.join(resolve_model_dir(None), "tokenizer.json"))
    t0 = time.perf_counter()
    vocab = vocab_from_tokenizer(tok, 49152, eos_token_id=2)
    print(f"vocabulary: {time.perf_counter() - t0:.2f} s (once per tokenizer)")
    compiler = GrammarCompiler(vocab, GrammarCacheConfig(num_workers=1, timeout_s=60))
    compiler.start()
    compiler.submit(GrammarSpec.from_regex("warm")).wait(60)  # the worker process is up
    try:
        print("compile (worker process, warm):")
        bench_compile(compiler, {"json_object"} if args.skip_json_object else set())
        print("mask per step:")
        bench_mask(compiler, torch.device("cpu"))
        if torch.cuda.is_available():
            bench_mask(compiler, torch.device("cuda"))
        print("jump-forward (model follows the tokenizer's tokens):")
        bench_jump_forward(compiler, lambda s: tok.encode(s, add_special_tokens=False).ids)
    finally:
        compiler.close()


if __name__ == "__main__":
    main()
