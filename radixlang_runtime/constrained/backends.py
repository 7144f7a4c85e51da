"""Grammar backends (--grammar-backend, SGLang's flag): which library compiles a GrammarSpec. Torch-free.

  outlines    outlines-core Index over the regex's byte DFA (grammar.py): regex, json_schema
  xgrammar    xgrammar's pushdown automaton (xgrammar_backend.py): regex, json_schema, ebnf, structural_tag
  llguidance  llguidance's Earley parser (llguidance_backend.py): regex, json_schema, ebnf, structural_tag

Every backend compiles in the rlimit'd compile child (worker_child.py) and answers a picklable payload;
the parent loads it into a grammar object with one interface (CompiledGrammar's: initial_state,
allowed(state), next_state, is_final, accepts, forced_cache, draft_prefs), so masks (mask.py),
GrammarState and jump-forward are the same code for all. json_schema compiles the same regex in
every backend (schema.py: the keyword checks and the fixed separators hold whatever the backend).
The default, `auto`, pins none: each grammar's kind picks a backend that compiles it (AUTO_PICK:
outlines for regex / json_schema, xgrammar for ebnf / structural_tag; auto_compiler.KindRoutedCompiler).
A kind a pinned backend cannot compile is refused by name (refuse_unsupported, an HTTP 400).
"""

from __future__ import annotations

from typing import Any

BACKENDS = ("outlines", "xgrammar", "llguidance")
AUTO = "auto"  # --grammar-backend's default: the kind picks (AUTO_PICK)
KINDS: dict[str, frozenset[str]] = {
    "outlines": frozenset({"regex", "json_schema"}),
    "xgrammar": frozenset({"regex", "json_schema", "ebnf", "structural_tag"}),
    "llguidance": frozenset({"regex", "json_schema", "ebnf", "structural_tag"}),
}
AUTO_PICK = {"regex": "outlines", "json_schema": "outlines", "ebnf": "xgrammar", "structural_tag": "xgrammar"}


def backend_for(configured: str, kind: str) -> str:
    """The backend that compiles a grammar of `kind` on a server run with --grammar-backend `configured`."""
    return AUTO_PICK[kind] if configured == AUTO else configured


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"unknown grammar backend {name!r} ({' | '.join(BACKENDS)})")
    return name


def refuse_unsupported(backend: str, kind: str) -> None:
    """ValueError naming the kind and the backends that can do it, when `backend` cannot (auto: every kind)."""
    if backend != AUTO and kind not in KINDS[check_backend(backend)]:
        able = [b for b in BACKENDS if kind in KINDS[b]]
        raise ValueError(f"{kind} grammars need --grammar-backend {' or '.join(able)} (this server runs {backend})")


def import_backend(backend: str) -> None:
    """Import the backend's library (the compile child does it before its memory cap)."""
    if backend == "outlines":
        import outlines_core  # noqa: F401
    elif backend == "xgrammar":
        import xgrammar  # noqa: F401
    else:
        import llguidance  # noqa: F401


def compile_payload(backend: str, kind: str, text: str, vocab: Any) -> Any:
    """Compile in this process -> the picklable payload load_grammar takes. `vocab` is the backend's
    vocabulary object (vocab_object). ValueError naming the problem."""
    if backend == "outlines":
        from radixlang_runtime.constrained.compile_index import build_index

        return build_index(kind, text, vocab[0], vocab[1])
    if backend == "xgrammar":
        from radixlang_runtime.constrained.xgrammar_backend import compile_xgrammar

        return compile_xgrammar(kind, text, vocab)
    from radixlang_runtime.constrained.llguidance_backend import compile_llguidance

    return compile_llguidance(kind, text, vocab)


def vocab_object(backend: str, eos: int, sentinel: str, byte_map: dict[bytes, list[int]]) -> Any:
    """The backend's vocabulary, built once per child from the parent's byte map (vocab.py)."""
    if backend == "outlines":
        from outlines_core import Vocabulary

        return Vocabulary(eos, byte_map), sentinel
    width = byte_map[sentinel.encode("utf-8")][0]  # the sentinel's id is the logits width
    table: list[bytes] = [b""] * width
    for b, ids in byte_map.items():
        for i in ids:
            if i < width:
                table[i] = b
    if backend == "xgrammar":
        from radixlang_runtime.constrained.xgrammar_backend import tokenizer_info

        return tokenizer_info(table, eos)
    from radixlang_runtime.constrained.llguidance_backend import ll_tokenizer

    return ll_tokenizer(table, eos)


def load_grammar(backend: str, spec: Any, payload: Any, vocab: Any, seconds: float) -> Any:
    """A compile payload (unpickled) -> the grammar object the runtime uses (grammar.CompiledGrammar or
    matcher_grammar.MatcherGrammar)."""
    if backend == "outlines":
        import pickle

        from radixlang_runtime.constrained.grammar import CompiledGrammar

        return CompiledGrammar(spec, payload, vocab, len(pickle.dumps(payload)), seconds)
    if backend == "xgrammar":
        from radixlang_runtime.constrained.xgrammar_backend import load_xgrammar

        return load_xgrammar(spec, payload, vocab, seconds)
    from radixlang_runtime.constrained.llguidance_backend import load_llguidance

    return load_llguidance(spec, payload, vocab, seconds)
