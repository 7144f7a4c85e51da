"""Grammar memory: this process's RSS while N distinct grammars are compiled (in the compile child, as the server
does), loaded and walked along a short output (their allowed sets cached), then after GrammarCompiler.clear() (what
/flush_cache calls). The scheduler process holds exactly these objects; the model is left out so N can be large.

    python benchmarks/bench_grammar_memory.py [--backend xgrammar] [--n 200]
"""

from __future__ import annotations

import argparse
import os
import time

import psutil
from tokenizers import Tokenizer

from radixlang_runtime.constrained.cache import GrammarCacheConfig, GrammarCompiler
from radixlang_runtime.constrained.spec import GrammarSpec
from radixlang_runtime.constrained.state import GrammarState
from radixlang_runtime.constrained.vocab import vocab_from_tokenizer
from radixlang_runtime.model.loader.resolve import resolve_model_dir


def _walk(compiler: GrammarCompiler, i: int, encode) -> None:
    h = compiler.submit(GrammarSpec.from_ebnf(f'root ::= "k{i} " [a-z ]{{0,40}} "."'))
    assert h.wait(120) == "ready", h.error
    gs = GrammarState(h.grammar, [2], budget=compiler.guard.new_budget())
    for t in encode(f"k{i} the quick brown fox."):
        gs.allowed()
        assert gs.advance(t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="xgrammar")
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    tok = Tokenizer.from_file(os.path.join(resolve_model_dir(None), "tokenizer.json"))
    encode = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    vocab = vocab_from_tokenizer(tok, 49152, eos_token_id=2)
    vocab.encode = encode
    compiler = GrammarCompiler(vocab, GrammarCacheConfig(num_workers=1, backend=args.backend))
    proc = psutil.Process()
    try:
        for i in range(5):  # the backend's one-time structures (tokenizer info, thread pools)
            _walk(compiler, i, encode)
        compiler.clear()
        before = proc.memory_info().rss
        t0 = time.perf_counter()
        for i in range(100, 100 + args.n):
            _walk(compiler, i, encode)
        grown, held = proc.memory_info().rss, compiler.cached_bytes
        compiler.clear()
        after = proc.memory_info().rss
        mib = 1 << 20
        print(f"{args.backend}, {args.n} distinct grammars in {time.perf_counter() - t0:.0f} s: RSS before "
              f"{before / mib:.0f} MiB, after {grown / mib:.0f} MiB (+{(grown - before) / mib:.0f}; the cache "
              f"weighs {held / mib:.0f} MiB), after clear {after / mib:.0f} MiB ({(after - before) / before:+.1%})")
    finally:
        compiler.close()


if __name__ == "__main__":
    main()
