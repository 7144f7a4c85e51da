"""xgrammar backend: compile (in the compile child) to xgrammar's serialized CompiledGrammar, load it in
the scheduler process behind MatcherGrammar. Imports xgrammar (and so torch) only when called.

Kinds: regex (our checked regex, compiled by xgrammar's regex converter), json_schema (the same fixed-
separator regex the outlines backend compiles: schema.py's keyword checks and layout hold here too),
ebnf (GBNF-style, `root` rule), structural_tag (free text; after a trigger, one of the structures:
begin, a JSON value of its schema, end).
Errors are ValueError without xgrammar's "[time] file.cc:line:" prefix, e.g.
"ebnf: EBNF parser error at line 1, column 10: Rule \"expr\" is not defined".
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

import numpy as np

from radixlang_runtime.constrained.automaton_size import check_automaton_size
from radixlang_runtime.constrained.compile_index import compile_error_subject
from radixlang_runtime.constrained.grammar_cost import check_ebnf_cost, check_regex_cost
from radixlang_runtime.constrained.schema import schema_to_regex
from radixlang_runtime.constrained.spec import GrammarSpec
from radixlang_runtime.constrained.vocab import TokenVocab

_PREFIX = re.compile(r"^\s*\[[0-9:]+\]\s+\S+:\d+:\s*")
_INFO_CACHE: dict[str, Any] = {}  # tokenizer_id -> TokenizerInfo (the scheduler process's)


def tokenizer_info(table: list[bytes], eos: int) -> Any:
    """Raw token bytes (b"" for special / absent ids) -> xgrammar.TokenizerInfo; EOS is the one stop token."""
    import xgrammar as xgr

    return xgr.TokenizerInfo(table, xgr.VocabType.RAW, vocab_size=len(table), stop_token_ids=[eos])


def info_for(vocab: TokenVocab) -> Any:
    info = _INFO_CACHE.get(vocab.tokenizer_id)
    if info is None:
        info = tokenizer_info([b or b"" for b in vocab.token_bytes], vocab.eos_token_id)
        _INFO_CACHE[vocab.tokenizer_id] = info
    return info


def _clean(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return _PREFIX.sub("", msg[0] if msg else type(e).__name__)[:400]


def _structural_tag(compiler: Any, text: str) -> Any:
    import xgrammar as xgr

    tag = json.loads(text)
    items = [xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
             for s in tag["structures"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the (tags, triggers) form is SGLang's shape; xgrammar calls it legacy
        return compiler.compile_structural_tag(items, tag["triggers"])


_SURROGATES = "\\uD800-\\uDFFF"


def no_surrogates(regex: str) -> str:
    """xgrammar's regex converter lets `.` and negated classes match UTF-16 surrogates (U+D800-DFFF) as
    3-byte sequences, which are not UTF-8: a byte-level vocabulary could then write bytes no decoder reads
    (tests/constrained/test_random_schemas.py found it). Rewritten: every negated class excludes them, `.` becomes
    [^\\n + them] (Rust's `.`: any character but newline). Escapes and `.` inside classes are kept."""
    out, i, depth = [], 0, 0  # depth: inside a character class (nested classes count)
    negated: list[bool] = []
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            out.append(regex[i:i + 2])
            i += 2
            continue
        if c == "[":
            neg = regex.startswith("[^", i)
            negated.append(neg)
            depth += 1
            out.append("[^" if neg else "[")
            i += 2 if neg else 1
            if i < len(regex) and regex[i] == "]":  # a leading "]" is a literal
                out.append("\\]")
                i += 1
            continue
        if c == "]" and depth:
            depth -= 1
            out.append((_SURROGATES if negated.pop() else "") + "]")
        elif c == "." and not depth:
            out.append("[^\\n" + _SURROGATES + "]")
        else:
            out.append(c)
        i += 1
    return "".join(out)


def compile_xgrammar(kind: str, text: str, info: Any) -> str:
    """-> the compiled grammar's serialize_json() text. ValueError naming the problem."""
    import xgrammar as xgr

    what = compile_error_subject(kind, text)
    regex = ""
    if kind in ("regex", "json_schema"):
        regex = text if kind == "regex" else schema_to_regex(text)
        check_automaton_size(regex, what)  # a regex bomb is refused before the compile starts
        check_regex_cost(regex, what, nested=True)  # so is what the matcher finds expensive per token
    elif kind == "ebnf":
        check_ebnf_cost(text, what)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    try:
        if kind in ("regex", "json_schema"):
            cg = compiler.compile_regex(no_surrogates(regex))
        elif kind == "ebnf":
            cg = compiler.compile_grammar(text)
        elif kind == "structural_tag":
            cg = _structural_tag(compiler, text)
        else:
            raise ValueError(f"unknown grammar kind {kind!r}")
    except ValueError:
        raise
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{what}: {_clean(e)}") from None
    return cg.serialize_json()


class XgrammarMatcher:
    """xgrammar.GrammarMatcher in MatcherGrammar's terms (matcher_grammar.Matcher)."""

    def __init__(self, compiled: Any, width: int):
        import xgrammar as xgr

        self._m = xgr.GrammarMatcher(compiled, max_rollback_tokens=-1)
        self._bitmask = xgr.allocate_token_bitmask(1, width)  # int32 [1, ceil(width / 32)]
        self._width = width

    def accept(self, token_id: int) -> bool:
        return bool(self._m.accept_token(token_id))

    def rollback(self, n: int) -> bool:
        try:
            self._m.rollback(n)
        except (RuntimeError, ValueError):
            return False
        return True

    def reset(self) -> None:
        self._m.reset()

    def allowed_bits(self) -> np.ndarray:
        self._m.fill_next_token_bitmask(self._bitmask)
        words = self._bitmask[0].numpy().view(np.uint8)
        return np.unpackbits(words, bitorder="little")[: self._width].astype(bool)

    def forced_prefix(self) -> bytes:
        return self._m.find_jump_forward_string().encode("utf-8")


def load_xgrammar(spec: GrammarSpec, payload: str, vocab: TokenVocab, seconds: float) -> Any:
    import xgrammar as xgr

    from radixlang_runtime.constrained.matcher_grammar import MatcherGrammar

    compiled = xgr.CompiledGrammar.deserialize_json(payload, info_for(vocab))
    return MatcherGrammar(spec, XgrammarMatcher(compiled, vocab.logits_width), vocab, "xgrammar",
                          len(payload), seconds, native_nbytes=int(compiled.memory_size_bytes))
