"""Constrained decoding costs on the embedded SmolLM2 tokenizer:
- compile time per grammar: cold (in a warm worker process, no cache), then cached (LRU hit);
- the batched mask per step at batch 32 (CPU; CUDA too when present), per-state tensors cached;
- jump-forward: forward passes per output with it on vs off, for a few JSON outputs;
- --e2e: the real Engine (fp32 greedy) on JSON extraction, 8 schemas x 16 prompts, all requests at
  once: jump-forward on vs off (identical text required, forward passes, output tok/s, every output
  validated with jsonschema), then the masking cost at batch 32: constrained (jump-forward off) vs
  unconstrained decoding of the same number of tokens.

- --backends outlines,xgrammar,llguidance: the same grammars side by side (--grammar-backend): compile
  ms (warm worker process), mask us/token along a JSON output (cold: the first request through those
  states; warm: the second), and with --e2e the JSON workload's tok/s and forced fraction per backend.
- --replay: the JSON workload's greedy outputs (outlines' Engine) replayed through each backend's jump-forward,
  one request after another: a forced fraction per backend on the same tokens that does not depend on the
  order concurrent requests learned in (--e2e's fraction moves from run to run with it).
- --guard-overhead: the step guard's cost per decode step (batch 1 and 16; grammar calls inline vs on its thread).
- --quick: the small version for a loaded machine (no json_object / 10,000-value enum, 5 schemas x 2
  prompts end to end).

    python benchmarks/bench_constrained.py [--skip-json-object] [--e2e] [--backends B1,B2] [--quick] [--replay]
                                           [--guard-overhead]
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
from radixlang_runtime.model.loader.resolve import resolve_model_dir

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


QUICK_SKIP = {"json_object", "enum x 10,000"}


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


# Integers carry maxDigits (an outlines extension): an unbounded [0-9]+ lets a greedy small model
# loop on digits until max_new_tokens (seen once in 128 outputs), which no schema-valid JSON survives.
E2E_SCHEMAS = {
    "flat": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                              "age": {"type": "integer", "maxDigits": 4}},
             "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {"person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24}, "address": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20}},
            "required": ["city", "country"], "additionalProperties": False}},
        "required": ["name", "address"], "additionalProperties": False}}, "required": ["person"],
        "additionalProperties": False},
    "array": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                        "minItems": 1, "maxItems": 4}},
              "required": ["tags"], "additionalProperties": False},
    "enum": {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]},
                                              "confidence": {"enum": ["low", "medium", "high"]}},
             "required": ["sentiment", "confidence"], "additionalProperties": False},
    "tool_call": {"type": "object", "properties": {"name": {"enum": ["get_weather", "search_web", "send_email"]},
                                                   "arguments": {"type": "object", "properties": {
                                                       "query": {"type": "string", "maxLength": 40}},
                                                       "required": ["query"], "additionalProperties": False}},
                  "required": ["name", "arguments"], "additionalProperties": False},
    "booleans": {"type": "object", "properties": {"is_urgent": {"type": "boolean"}, "needs_reply": {"type": "boolean"}},
                 "required": ["is_urgent", "needs_reply"], "additionalProperties": False},
    "numbers": {"type": "object", "properties": {"price": {"type": "integer", "maxDigits": 4},
                                                 "quantity": {"type": "integer", "maxDigits": 4}},
                "required": ["price", "quantity"], "additionalProperties": False},
    "items": {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"product": {"type": "string", "maxLength": 16},
                                         "qty": {"type": "integer", "maxDigits": 4}},
        "required": ["product", "qty"], "additionalProperties": False}}}, "required": ["items"],
        "additionalProperties": False},
}
E2E_TEXTS = [
    "Ann Lee, 34, lives in Lyon, France, and wants two coffees at 3 dollars.",
    "Urgent: the server in Oslo is down, please reply with the weather search.",
    "Bob (52) from Toronto, Canada loved the new phone; order 1 phone at 799.",
    "Search the web for cheap flights to Rome and email the results to Kim.",
    "Maria, age 27, Madrid, Spain: the delivery was late and the box was damaged.",
    "Tom ordered 3 books and 2 pens; total price 45. Not urgent.",
    "The weather in Tokyo tomorrow? Li Wei, 41, asks from Beijing, China.",
    "Great service, fast shipping, would buy again! Five stars from Sara, 19.",
    "Please send an email to the team about the meeting on Friday in Berlin.",
    "Ravi, 60, from Pune, India, bought 4 lamps at 20 each.",
    "Terrible app, it crashes every day. Needs a reply from support.",
    "Find recipes for vegan pasta; Emma, 33, from Dublin, Ireland.",
    "Order: 10 apples and 6 pears for 12 dollars, urgent delivery to Paris.",
    "Neutral review: the hotel in Vienna was fine, nothing special.",
    "Check the weather in Cairo for Omar, 45, who lives in Alexandria, Egypt.",
    "Jo bought 1 laptop at 1200 and asks whether it needs a reply.",
]


def e2e_requests(quick: bool) -> tuple[list[str], list[dict], list[dict]]:
    # quick: the five schemas that compile in seconds (nested / items / array can pass the 20 s compile limit of
    # an Engine on a loaded 2-core machine when all compile at once)
    names = ["flat", "enum", "tool_call", "booleans", "numbers"] if quick else list(E2E_SCHEMAS)
    texts = E2E_TEXTS[:2] if quick else E2E_TEXTS
    reqs = [(f"<|im_start|>user\nExtract from: {t}\nReply with JSON ({name}).<|im_end|>\n<|im_start|>assistant\n",
             E2E_SCHEMAS[name]) for name in names for t in texts]
    sps = [{"temperature": 0, "max_new_tokens": 96, "json_schema": json.dumps(s)} for _, s in reqs]
    return [p for p, _ in reqs], sps, [s for _, s in reqs]


def run_json_workload(eng, prompts: list[str], sps: list[dict], schemas: list[dict], jf: bool) -> tuple:
    """-> (outputs, seconds, completion tokens, request forward passes, batch steps, forced tokens)."""
    import jsonschema

    eng._loop.call(lambda s: setattr(s.grammar, "jump_forward", jf))
    assert eng.flush_cache()
    steps0 = eng.get_stats()["forward_steps"]
    t = time.perf_counter()
    outs = eng.generate(prompts, sps)
    dt = time.perf_counter() - t
    toks = sum(o["meta_info"]["completion_tokens"] for o in outs)
    passes = sum(o["meta_info"]["forward_passes"] for o in outs)
    forced = sum(o["meta_info"]["forced_tokens"] for o in outs)
    for o, schema in zip(outs, schemas):
        if o["meta_info"]["finish_reason"]["type"] != "stop":
            raise AssertionError(f"cut at max_new_tokens, not complete: {o['text']!r}")
        jsonschema.validate(json.loads(o["text"]), schema)
    return outs, dt, toks, passes, eng.get_stats()["forward_steps"] - steps0, forced


def bench_e2e_backends(backends: list[str], quick: bool, warm: bool = True) -> None:
    """The JSON workload per backend (jump-forward on): tok/s, forced fraction, text equal to outlines'.
    warm False: no warm-up passes (tok/s then includes compiles; the forced fraction does not change)."""
    from radixlang_runtime import Engine

    prompts, sps, schemas = e2e_requests(quick)
    texts = {}
    print(f"JSON extraction per backend, {len(prompts)} requests, fp32 greedy, jump-forward on, all valid:")
    for backend in backends:
        eng = Engine(dtype="float32", max_total_tokens=32768, grammar_backend=backend)
        try:
            if warm:
                eng.generate(prompts[:2], sps[:2])  # compile the grammars, warm up
                eng.generate(prompts, sps)
            outs, dt, toks, passes, steps, forced = run_json_workload(eng, prompts, sps, schemas, True)
        finally:
            eng.shutdown()
        texts[backend] = [o["text"] for o in outs]
        same = sum(a == b for a, b in zip(texts[backend], texts[backends[0]]))
        print(f"  {backend:10s} {toks} tokens in {dt:.2f} s = {toks / dt:.1f} tok/s, forced {forced}/{toks} "
              f"= {forced / toks:.1%}, request passes {passes}, batch steps {steps}, "
              f"text equal to {backends[0]}'s: {same}/{len(prompts)}")


def replay_forced(runs: list[tuple[dict, list[int]]], backends: list[str], vocab) -> None:
    """Jump-forward's forced fraction on fixed outputs, one request after another, as the scheduler drafts:
    draft_tokens + guess_tokens from the state, the prefix the output agrees with is accepted (forced), a
    disagreement teaches the grammar the output's token there (learn_rejection), the output's next token is
    the model's own. Deterministic (the Engine's concurrent requests learn from each other in a run-dependent
    order), and the same tokens for every backend that allows them."""
    from radixlang_runtime.constrained.grammar import compile_grammar
    from radixlang_runtime.constrained.jump_forward import draft_tokens, guess_tokens, learn_rejection

    for backend in backends:
        grammars: dict[str, object] = {}
        forced = total = 0
        for schema, ids in runs:
            key = json.dumps(schema, sort_keys=True)
            if key not in grammars:
                grammars[key] = compile_grammar(GrammarSpec.from_json_schema(schema), vocab, backend)
            gs, pos = GrammarState(grammars[key], {vocab.eos_token_id}), 0
            while pos < len(ids):
                probe = gs.copy()
                draft = draft_tokens(probe)
                draft += guess_tokens(probe)
                n = 0
                while n < len(draft) and pos + n < len(ids) and draft[n] == ids[pos + n]:
                    assert gs.advance(draft[n])
                    n += 1
                if n < len(draft) and pos + n < len(ids):
                    learn_rejection(gs, ids[pos + n])
                forced, pos = forced + n, pos + n
                if pos < len(ids) and ids[pos] != vocab.eos_token_id:
                    if not gs.advance(ids[pos]):
                        raise AssertionError(f"{backend} refuses the output's token at {pos} (a narrower mask)")
                pos += 1
            total += len(ids)
        print(f"  {backend:10s} forced {forced}/{total} = {forced / total:.1%}")


def bench_replay(backends: list[str], quick: bool, vocab) -> None:
    """The JSON workload's greedy outputs (outlines' Engine, fp32) replayed through each backend's jump-forward."""
    from radixlang_runtime import Engine

    prompts, sps, schemas = e2e_requests(quick)
    eng = Engine(dtype="float32", max_total_tokens=32768)
    try:
        outs = eng.generate(prompts, sps)
    finally:
        eng.shutdown()
    print(f"forced fraction replayed on the same {len(outs)} outputs, one request after another:")
    replay_forced([(s, o["output_ids"]) for s, o in zip(schemas, outs)], backends, vocab)


def bench_mask_per_token(backends: list[str], vocab, encode) -> None:
    """us per token along a JSON output at batch 1: advance + allowed set + mask row (cold: fresh grammar
    object, every state new; warm: the same walk again, per-state caches hit). CPU time of this process
    on one torch thread, so other processes' load does not count."""
    from radixlang_runtime.constrained.grammar import compile_grammar

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _mask_per_token(backends, vocab, encode, compile_grammar)
    finally:
        torch.set_num_threads(threads)


def _mask_per_token(backends: list[str], vocab, encode, compile_grammar) -> None:
    for schema, value in OUTPUTS:
        target = encode(json.dumps(value))
        spec = GrammarSpec.from_json_schema(schema)
        for backend in backends:
            g = compile_grammar(spec, vocab, backend)
            logits = torch.zeros(1, vocab.logits_width)
            per = []
            for _ in range(2):
                gs = GrammarState(g, [2])
                t0 = time.process_time()
                for t in target:
                    mask_logits(logits, [0], [gs])
                    assert gs.advance(t)
                per.append((time.process_time() - t0) / len(target))
            print(f"  {backend:10s} {json.dumps(value)[:36]:36s} {len(target)} tokens: cold {per[0] * 1e6:7.1f} "
                  f"us/token, warm {per[1] * 1e6:7.1f} us/token")


def bench_guard_overhead(backends: list[str], vocab, encode) -> None:
    """Wall us per step along a JSON output at batch 1 and 16, cold (fresh grammar objects: every state new, as
    while decoding): grammar calls inline vs on the step guard's thread (constrained/step_guard.py). Medians
    over the steps of one walk per mode; the modes alternate (inline first, then guarded, then inline)."""
    from radixlang_runtime.constrained.grammar import compile_grammar
    from radixlang_runtime.constrained.step_guard import StepGuard

    schema, value = OUTPUTS[0]
    target = encode(json.dumps(value))
    spec = GrammarSpec.from_json_schema(schema)
    torch.set_num_threads(1)  # the mask on one thread: other processes' load moves it less
    for backend in backends:
        for batch in (1, 16):
            res: dict[str, list[float]] = {"inline": [], "guarded": []}
            for mode in ("inline", "guarded", "inline", "guarded"):
                guard = StepGuard() if mode == "guarded" else None
                states = []
                for _ in range(batch):
                    g = compile_grammar(spec, vocab, backend)
                    g.guard = guard
                    states.append(GrammarState(g, [2], budget=guard.new_budget() if guard else None))
                logits = torch.zeros(batch, vocab.logits_width)
                for t in target:
                    t0 = time.perf_counter()
                    mask_logits(logits, list(range(batch)), states)
                    for gs in states:
                        assert gs.advance(t)
                        gs.allowed()  # the scheduler's must_finish check after a token
                    res[mode].append(time.perf_counter() - t0)
                if guard is not None:
                    guard.close()
            a, b = statistics.median(res["inline"]), statistics.median(res["guarded"])
            print(f"  {backend:10s} batch {batch:2d}, {len(target)} steps x 2: inline {a * 1e6:8.1f} us/step, "
                  f"guarded {b * 1e6:8.1f} us/step ({(b - a) * 1e6:+.1f} us)")


def bench_e2e() -> None:
    from radixlang_runtime import Engine

    eng = Engine(dtype="float32", max_total_tokens=65536)
    try:
        prompts, sps, schemas = e2e_requests(False)
        eng.generate(prompts[:2], sps[:2])  # compile every grammar once (cached), warm up
        eng.generate(prompts, sps)
        results = {}
        for jf in (True, False):
            results[jf] = run_json_workload(eng, prompts, sps, schemas, jf)[:5]
        on, off = results[True], results[False]
        same = sum(a["text"] == b["text"] for a, b in zip(on[0], off[0]))
        print(f"JSON extraction, {len(prompts)} requests (8 schemas x 16 prompts), fp32 greedy, all valid:")
        for jf, (outs, dt, toks, passes, steps) in results.items():
            print(f"  jump-forward {'on ' if jf else 'off'}: {toks} tokens in {dt:.2f} s = {toks / dt:.1f} tok/s, "
                  f"request forward passes {passes}, batch steps {steps}")
        print(f"  identical text on/off: {same}/{len(prompts)}; request forward passes -{1 - on[3] / off[3]:.1%}, "
              f"batch steps -{1 - on[4] / off[4]:.1%}, wall {off[1] / on[1]:.2f}x")
        # masking cost at batch 32: constrained (jump-forward off) vs unconstrained with the same
        # prompts and the same number of output tokens per request (the constrained run's counts, EOS
        # ignored), so both do the same prefill and the same decode steps; the modes take turns.
        eng._loop.call(lambda s: setattr(s.grammar, "jump_forward", False))
        sub, sub_sps = prompts[:32], [dict(s, max_new_tokens=24) for s in sps[:32]]
        rates = {"constrained": [], "unconstrained": []}
        free_sps = None
        for r in range(3):  # round 0 runs constrained first: its token counts set free_sps
            for kind in (("constrained", "unconstrained") if r % 2 == 0 else ("unconstrained", "constrained")):
                assert eng.flush_cache()
                sp = sub_sps if kind == "constrained" else free_sps
                t = time.perf_counter()
                outs = eng.generate(sub, sp)
                rates[kind].append(sum(o["meta_info"]["completion_tokens"] for o in outs) / (time.perf_counter() - t))
                if kind == "constrained" and free_sps is None:
                    free_sps = [{"temperature": 0, "ignore_eos": True,
                                 "max_new_tokens": o["meta_info"]["completion_tokens"]}
                                for o in outs]
        c, u = statistics.median(rates["constrained"]), statistics.median(rates["unconstrained"])
        print(f"batch 32, jump-forward off, medians of 3, same output token counts: constrained {c:.1f} tok/s, "
              f"unconstrained {u:.1f} tok/s ({c / u:.1%} of unconstrained)")
    finally:
        eng.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-json-object", action="store_true")
    ap.add_argument("--e2e", action="store_true", help="also run the real Engine on the JSON workload")
    ap.add_argument("--backends", default="outlines", help="comma-separated: outlines,xgrammar,llguidance")
    ap.add_argument("--quick", action="store_true", help="small grammars and workload (a loaded machine)")
    ap.add_argument("--e2e-only", action="store_true", help="only the Engine's JSON workload per backend")
    ap.add_argument("--no-warm", action="store_true", help="--e2e-only without warm-up passes (forced fraction)")
    ap.add_argument("--replay", action="store_true", help="only the forced fraction replayed on fixed outputs")
    ap.add_argument("--guard-overhead", action="store_true",
                    help="only the step guard's cost per step (batch 1 and 16, grammar calls inline vs guarded)")
    args = ap.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.e2e_only:
        bench_e2e_backends(backends, args.quick, warm=not args.no_warm)
        return
    tok = Tokenizer.from_file(os.path.join(resolve_model_dir(None), "tokenizer.json"))
    encode = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    t0 = time.perf_counter()
    vocab = vocab_from_tokenizer(tok, 49152, eos_token_id=2)
    vocab.encode = encode
    print(f"vocabulary: {time.perf_counter() - t0:.2f} s (once per tokenizer)")
    if args.replay:
        bench_replay(backends, args.quick, vocab)
        return
    if args.guard_overhead:
        print("step guard: wall time per step, cold states:")
        bench_guard_overhead(backends, vocab, encode)
        return
    skip = (QUICK_SKIP if args.quick else set()) | ({"json_object"} if args.skip_json_object else set())
    for backend in backends:
        compiler = GrammarCompiler(vocab, GrammarCacheConfig(num_workers=1, timeout_s=60, backend=backend))
        compiler.start()
        compiler.submit(GrammarSpec.from_regex("warm")).wait(120)  # the worker process is up
        try:
            print(f"[{backend}] compile (worker process, warm):")
            bench_compile(compiler, skip)
            if args.quick:
                continue
            print(f"[{backend}] mask per step:")
            bench_mask(compiler, torch.device("cpu"))
            if torch.cuda.is_available():
                bench_mask(compiler, torch.device("cuda"))
            print(f"[{backend}] jump-forward (model follows the tokenizer's tokens):")
            bench_jump_forward(compiler, encode)
        finally:
            compiler.close()
    print("mask + advance per token, batch 1:")
    bench_mask_per_token(backends, vocab, encode)
    if args.e2e and (len(backends) > 1 or args.quick):
        bench_e2e_backends(backends, args.quick)
    elif args.e2e:
        bench_e2e()


if __name__ == "__main__":
    main()
