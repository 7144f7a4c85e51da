"""llguidance backend: the compile child validates and builds llguidance's grammar text; the scheduler
process runs an LLMatcher (Earley parser, lazy: no eager token index) behind MatcherGrammar. No torch.

Kinds: regex (Rust regex syntax, the dialect the outlines backend speaks), json_schema (the same
fixed-separator regex as every backend, schema.py), ebnf (GBNF, or Lark, with llguidance's converter),
structural_tag (StructTag: free text, after a trigger one of the structures: begin, JSON of its schema, end).
llguidance's own resource limits (LLParserLimits: lexer states, Earley items per token) answer a
hostile grammar with an error at validation, on top of the compile child's time and memory caps.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

import numpy as np

from radixlang_runtime.constrained.automaton_size import check_automaton_size
from radixlang_runtime.constrained.compile_index import compile_error_subject
from radixlang_runtime.constrained.grammar_cost import check_ebnf_cost, check_regex_cost
from radixlang_runtime.constrained.schema import schema_to_regex
from radixlang_runtime.constrained.spec import GrammarSpec
from radixlang_runtime.constrained.vocab import TokenVocab

LL_BYTES_PER_CHAR = 64  # a matcher's tables per grammar-text character (RSS delta at load, a rough bound)
_TOKENIZERS: dict[str, Any] = {}  # tokenizer_id -> LLTokenizer (the scheduler process's)


class _Tokens:
    """What llguidance.TokenizerWrapper reads: raw token bytes, EOS, special ids, and an encoder. llguidance
    narrows the mask to the encoder's split of bytes the grammar forces, so the scheduler process passes
    the model's tokenizer (jump-forward forces the same split); the compile child, which only validates,
    spells text with single-byte tokens."""

    def __init__(self, table: list[bytes], eos: int, encode: Optional[Callable[[str], list[int]]] = None):
        self.tokens = [b if b else b"<|special_%d|>" % i for i, b in enumerate(table)]
        self.eos_token_id = eos
        self.bos_token_id = None
        self.special_token_ids = [i for i, b in enumerate(table) if not b]
        self._single = {b[0]: i for i, b in enumerate(table) if len(b) == 1}
        self._encode = encode

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("text, not bytes")  # TokenizerWrapper probes bytes once, then passes str
        if self._encode is not None:
            return list(self._encode(text))
        return [self._single[b] for b in text.encode("utf-8") if b in self._single]


def ll_tokenizer(table: list[bytes], eos: int, encode: Optional[Callable[[str], list[int]]] = None) -> Any:
    import llguidance

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Tokens(table, eos, encode)))


def tokenizer_for(vocab: TokenVocab) -> Any:
    tok = _TOKENIZERS.get(vocab.tokenizer_id)
    if tok is None:
        tok = ll_tokenizer([b or b"" for b in vocab.token_bytes], vocab.eos_token_id, vocab.encode)
        _TOKENIZERS[vocab.tokenizer_id] = tok
    return tok


def _structural_tag(text: str) -> str:
    from llguidance import StructTag

    tag = json.loads(text)
    tags = [StructTag(trigger=next(t for t in tag["triggers"] if s["begin"].startswith(t)), begin=s["begin"],
                      grammar=s["schema"], end=s["end"]) for s in tag["structures"]]
    return StructTag.to_grammar(tags, assume_special=False)


def grammar_text(kind: str, text: str) -> str:
    import llguidance

    if kind in ("regex", "json_schema"):
        regex = text if kind == "regex" else schema_to_regex(text)
        check_automaton_size(regex, compile_error_subject(kind, text))  # a regex bomb: refused before compiling
        check_regex_cost(regex, compile_error_subject(kind, text), nested=False)
        return _convert(kind, text, lambda: llguidance.grammar_from("regex", regex))
    if kind == "ebnf":
        check_ebnf_cost(text, compile_error_subject(kind, text))
        return _convert(kind, text, lambda: llguidance.grammar_from("gbnf", text))
    if kind == "structural_tag":
        return _convert(kind, text, lambda: llguidance.grammar_from("lark", _structural_tag(text)))
    raise ValueError(f"unknown grammar kind {kind!r}")


def _convert(kind: str, text: str, fn: Callable[[], str]) -> str:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the converters raise several types; the client gets the message
        raise ValueError(f"{compile_error_subject(kind, text)}: {str(e)[:400]}") from None


def compile_llguidance(kind: str, text: str, tokenizer: Any) -> str:
    """-> llguidance's grammar text, validated against the tokenizer. ValueError naming the problem."""
    from llguidance import LLMatcher

    grammar = grammar_text(kind, text)
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if is_error:
        raise ValueError(f"{compile_error_subject(kind, text)}: {' '.join(messages)[:400]}")
    return grammar


class LLMatcherAdapter:
    """llguidance.LLMatcher in MatcherGrammar's terms (matcher_grammar.Matcher)."""

    def __init__(self, tokenizer: Any, grammar: str, width: int):
        import llguidance
        import llguidance.numpy as lln

        self._m = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if self._m.is_error():
            raise ValueError(f"llguidance: {self._m.get_error()}")
        self._fill = lln.fill_next_token_bitmask
        self._bitmask = lln.allocate_token_bitmask(1, tokenizer.vocab_size)  # int32 [1, ceil(V / 32)]
        self._width = width

    def accept(self, token_id: int) -> bool:
        return bool(self._m.consume_token(token_id)) and not self._m.is_error()

    def rollback(self, n: int) -> bool:
        return bool(self._m.rollback(n)) and not self._m.is_error()

    def reset(self) -> None:
        self._m.reset()

    def allowed_bits(self) -> np.ndarray:
        self._fill(self._m, self._bitmask, 0)
        return np.unpackbits(self._bitmask[0].view(np.uint8), bitorder="little")[: self._width].astype(bool)

    def forced_prefix(self) -> bytes:
        return bytes(self._m.compute_ff_bytes())

    def forced_token_ids(self) -> list[int]:
        """llguidance's forced tokens: the encoder's split of the forced bytes, the tail that a longer
        token could still extend already held back ("chop")."""
        return list(self._m.compute_ff_tokens())


def load_llguidance(spec: GrammarSpec, payload: str, vocab: TokenVocab, seconds: float) -> Any:
    from radixlang_runtime.constrained.matcher_grammar import MatcherGrammar

    matcher = LLMatcherAdapter(tokenizer_for(vocab), payload, vocab.logits_width)
    # llguidance names no size: its lexer and parser tables, estimated from the grammar text
    return MatcherGrammar(spec, matcher, vocab, "llguidance", len(payload), seconds,
                          native_nbytes=LL_BYTES_PER_CHAR * len(payload))
