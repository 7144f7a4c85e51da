"""Measure: the pre-check's character-state count (automaton_size.py) against outlines-core's compile time
on the embedded SmolLM2 vocabulary: each Index built in a forked process under the server's memory cap
(2 GiB RLIMIT_AS) and a longer time limit, without the pre-check (so every row is outlines-core's own
cost). The figures chose automaton_size.MAX_STATES (docs/PERFORMANCE.md, "Grammar pre-check").

    python benchmarks/bench_grammar_precheck.py [--timeout 60] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pickle
import time

from radixlang_runtime.constrained.automaton_size import TooLarge, Unanalysable, determinize
from radixlang_runtime.constrained.compile_index import grammar_regex
from radixlang_runtime.constrained.schema import canonical_schema
from radixlang_runtime.constrained.spec import JSON_OBJECT_SCHEMA

STRINGS_20 = {"type": "object", "properties": {f"f{i}": {"type": "string", "maxLength": 64} for i in range(20)},
              "required": [f"f{i}" for i in range(20)]}
CASES: list[tuple[str, str]] = (
    [("regex", f"[0-9]{{{n}}}") for n in (2000, 8000, 20000, 50000)]
    + [("regex", f"[a-z]{{{n}}}") for n in (1000, 4000, 16000)]
    + [("regex", f'[^"]{{{n}}}') for n in (500, 2000, 8000)]
    + [("regex", f".*a.{{{k}}}") for k in (8, 10, 12, 14)]
    + [("regex", f"(a|b)*a(a|b){{{k}}}") for k in (10, 12, 14, 16)]
    + [("regex", r"[a-z0-9._%+-]{1,32}@[a-z0-9.-]{1,32}\.[a-z]{2,6}"),
       ("json_schema", JSON_OBJECT_SCHEMA),
       ("json_schema", canonical_schema({"enum": [f"value_{i}" for i in range(10_000)]})),
       ("json_schema", canonical_schema(STRINGS_20)),
       ("json_schema", canonical_schema({"type": "string", "maxLength": 2000})),
       ("json_schema", canonical_schema({"type": "string", "maxLength": 8000}))])


def char_states(kind: str, text: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    try:
        d = determinize(grammar_regex(kind, text), max_states=1 << 22, max_positions=1 << 22, max_work=1 << 30,
                        deadline_s=120)
        out = f"{d.num_states} (work {d.work:,})"
    except (TooLarge, Unanalysable) as e:
        out = f"no verdict: {e}"
    return out, time.perf_counter() - t0


def _compile_in_child(regex: str, vocabulary, memory: int, conn) -> None:
    import resource

    from outlines_core import Index

    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    t0 = time.perf_counter()
    try:
        index = Index(regex, vocabulary)
        conn.send(("ok", time.perf_counter() - t0, len(pickle.dumps(index))))
    except BaseException as e:  # noqa: BLE001 - reported as the row's result
        conn.send(("error", time.perf_counter() - t0, f"{type(e).__name__}: {str(e)[:50]}"))


def outlines_compile(regex: str, vocabulary, timeout: float, memory: int = 2 << 30) -> str:
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_compile_in_child, args=(regex, vocabulary, memory, send))
    t0 = time.perf_counter()
    proc.start()
    got = recv.poll(timeout)
    result = recv.recv() if got else None
    proc.kill()
    proc.join(10)
    if result is None:
        return f"over {time.perf_counter() - t0:.0f} s ({'killed' if proc.exitcode == -9 else 'died: memory'})"
    status, seconds, detail = result
    return f"{seconds:.2f} s, {detail / 1e6:.1f} MB pickled" if status == "ok" else f"{seconds:.1f} s: {detail}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    from tokenizers import Tokenizer

    from radixlang_runtime.constrained.vocab import vocab_from_tokenizer
    from radixlang_runtime.model.loader.resolve import resolve_model_dir

    d = resolve_model_dir(None)
    with open(os.path.join(d, "config.json")) as f:
        width = int(json.load(f)["vocab_size"])
    vocab = vocab_from_tokenizer(Tokenizer.from_file(os.path.join(d, "tokenizer.json")), width, 2)
    vocabulary = vocab.outlines_vocabulary()
    print("| grammar | char states (pre-check work) | pre-check s | outlines-core compile |")
    print("|---|---|---|---|")
    for kind, text in CASES:
        if args.only not in text:
            continue
        states, check_s = char_states(kind, text)
        regex = f"(?:{grammar_regex(kind, text)})\\x{{{ord(vocab.sentinel):X}}}"  # as compile_index builds it
        took = outlines_compile(regex, vocabulary, args.timeout)
        shown = text if len(text) <= 50 else text[:47] + "..."
        print(f"| {kind} `{shown}` | {states} | {check_s:.3f} | {took} |", flush=True)


if __name__ == "__main__":
    main()
