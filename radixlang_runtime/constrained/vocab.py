"""TokenVocab: the raw bytes each token id emits, built once per tokenizer.

Invariants:
- token_bytes has one entry per logits column (len == logits_width). An entry is None for special
  tokens, the EOS id, ids past the tokenizer's vocabulary, and ids at or past logits_width are never
  built (the mask cannot address them). Every other entry is non-empty bytes.
- byte_map() ({bytes: [ids]}) is what outlines-core's Vocabulary takes; it never holds EOS or a
  special token (Vocabulary refuses EOS, and special tokens are not text a grammar can match).
- tokenizer_id is a hash of (eos, width, every token's bytes): equal ids mean interchangeable indexes.
- single_byte_ids[b] is the lowest id whose bytes are exactly bytes([b]), -1 if none.
- End sentinel (works around outlines-core 0.2.14 dropping a token whose second-to-last byte ends
  a match, e.g. "x" after "3" in `3(xy)?`): grammars compile as `(?:R)S` where S is a character
  whose UTF-8 lead byte (0xF1..0xF4) no text token contains (tokens holding it are dropped, none for
  SmolLM2), and byte_map() adds a synthetic token sentinel_id = logits_width spelling S. "final" is
  then "S is accepted here" (grammar.py), and the only match point of the compiled regex is after S.
- first_byte[id] is token_bytes[id][0], -1 where token_bytes[id] is None.

Token strings are decoded by the tokenizer's family: GPT-2 byte-level (undo the byte<->unicode table:
'Ġ' -> 0x20), SentencePiece (`▁` -> space, `<0xNN>` -> one byte), else the UTF-8 of the string.
Works on a `tokenizers.Tokenizer` or on a transformers fast tokenizer (its backend_tokenizer).
"""

from __future__ import annotations

import bisect
import hashlib
import re
from functools import lru_cache
from typing import Any, Callable, Optional, Sequence

import numpy as np

_SP_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def gpt2_unicode_to_byte() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted (char -> byte)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_str_to_bytes(s: str, family: str) -> bytes:
    """A vocabulary string -> the bytes it emits ("byte_level" | "sentencepiece" | "plain")."""
    if family == "byte_level":
        table = gpt2_unicode_to_byte()
        if all(c in table for c in s):
            return bytes(table[c] for c in s)
        return s.encode("utf-8")  # an added token written literally
    if family == "sentencepiece":
        m = _SP_BYTE.match(s)
        if m:
            return bytes([int(m.group(1), 16)])
        return s.replace("▁", " ").encode("utf-8")
    return s.encode("utf-8")


class TokenVocab:
    """Bytes per token id + the derived tables masks and jump-forward use. Immutable after build."""

    def __init__(self, token_bytes: Sequence[Optional[bytes]], eos_token_id: int,
                 encode: Optional[Callable[[str], list[int]]] = None):
        token_bytes = list(token_bytes)
        lead = min((0xF1, 0xF2, 0xF3, 0xF4), key=lambda x: sum(1 for b in token_bytes if b and x in b))
        self.sentinel = chr({0xF1: 0x40000, 0xF2: 0x80000, 0xF3: 0xC0000, 0xF4: 0x100000}[lead])
        self.token_bytes: tuple[Optional[bytes], ...] = tuple(None if b and lead in b else b for b in token_bytes)
        self.logits_width = len(self.token_bytes)
        self.sentinel_id = self.logits_width  # not a logits column: never sampled, never in a mask
        self.eos_token_id = eos_token_id
        self.encode = encode  # text -> ids without special tokens (jump-forward); None disables it
        assert 0 <= eos_token_id < self.logits_width, "eos_token_id must be a logits column"
        assert self.token_bytes[eos_token_id] is None, "EOS must not be a text token"
        h = hashlib.sha256(f"{eos_token_id}:{self.logits_width}:{ord(self.sentinel)}:".encode())
        first = np.full(self.logits_width, -1, dtype=np.int16)  # [W]
        single = np.full(256, -1, dtype=np.int64)  # [256]
        for i, b in enumerate(self.token_bytes):
            h.update(b"\xff" if b is None else len(b).to_bytes(4, "little") + b)
            if b is None:
                continue
            assert b, f"token {i} emits no bytes"
            first[i] = b[0]
            if len(b) == 1 and single[b[0]] < 0:
                single[b[0]] = i
        self.tokenizer_id = h.hexdigest()[:16]
        self.first_byte = first
        self.single_byte_ids = single
        order = sorted((b, i) for i, b in enumerate(self.token_bytes) if b is not None)
        self.sorted_bytes: list[bytes] = [b for b, _ in order]  # every text token's bytes, sorted
        self.sorted_ids = np.array([i for _, i in order], dtype=np.int64)  # ids in that order
        self.sorted_lens = np.array([len(b) for b, _ in order], dtype=np.int64)
        self._outlines_vocab: Any = None

    def byte_map(self) -> dict[bytes, list[int]]:
        """{bytes: [ids]} for outlines-core: every text token, plus the end sentinel."""
        out: dict[bytes, list[int]] = {self.sentinel.encode("utf-8"): [self.sentinel_id]}
        for i, b in enumerate(self.token_bytes):
            if b is not None:
                out.setdefault(b, []).append(i)
        return out

    def outlines_vocabulary(self) -> Any:
        """outlines_core.Vocabulary for compiling in this process (tests; the server compiles in a child)."""
        if self._outlines_vocab is None:
            from outlines_core import Vocabulary

            self._outlines_vocab = Vocabulary(self.eos_token_id, self.byte_map())
        return self._outlines_vocab

    def ids_with_prefix(self, prefix: bytes, longer_than: int) -> np.ndarray:
        """Ids of text tokens whose bytes start with `prefix` and are longer than `longer_than` bytes."""
        lo = bisect.bisect_left(self.sorted_bytes, prefix)
        upper = prefix.rstrip(b"\xff")  # the least byte string above every extension of prefix
        hi = (bisect.bisect_left(self.sorted_bytes, upper[:-1] + bytes([upper[-1] + 1]), lo)
              if upper else len(self.sorted_bytes))
        return self.sorted_ids[lo:hi][self.sorted_lens[lo:hi] > longer_than]

    def bytes_of(self, ids: Sequence[int]) -> Optional[bytes]:
        """Concatenated bytes of ids; None if one of them is not a text token."""
        parts = []
        for t in ids:
            b = self.token_bytes[t] if 0 <= t < self.logits_width else None
            if b is None:
                return None
            parts.append(b)
        return b"".join(parts)


def _family(backend: Any, vocab: dict[str, int]) -> str:
    dec = str(getattr(backend, "decoder", "") or "")
    if "ByteLevel" in dec:
        return "byte_level"
    if "ByteFallback" in dec or "Metaspace" in dec or any("▁" in s for s in list(vocab)[:2000]):
        return "sentencepiece"
    table = gpt2_unicode_to_byte()
    if all(c in table for s in list(vocab)[:2000] for c in s):
        return "byte_level"
    return "plain"


def vocab_from_tokenizer(tokenizer: Any, logits_width: Optional[int] = None,
                         eos_token_id: Optional[int] = None) -> TokenVocab:
    """A `tokenizers.Tokenizer` or a transformers fast tokenizer -> TokenVocab.

    logits_width: the model's logits width (config vocab_size); default: the largest id + 1.
    eos_token_id: default the transformers tokenizer's eos_token_id (required for a raw Tokenizer).
    """
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if eos_token_id is None:
        eos_token_id = getattr(tokenizer, "eos_token_id", None)
    table = token_byte_table(tokenizer, logits_width, eos_token_id)
    if eos_token_id is None:
        raise ValueError("eos_token_id is required for this tokenizer")

    def encode(text: str) -> list[int]:
        return backend.encode(text, add_special_tokens=False).ids

    return TokenVocab(table, eos_token_id, encode)


def token_byte_table(tokenizer: Any, logits_width: Optional[int] = None,
                     eos_token_id: Optional[int] = None) -> list[Optional[bytes]]:
    """The bytes each token id writes, one entry per logits column: None for special tokens, eos_token_id and
    ids the tokenizer lacks. TypeError for a tokenizer without a fast (tokenizers) backend."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not hasattr(backend, "get_added_tokens_decoder"):
        raise TypeError("constrained decoding needs a fast (tokenizers-backed) tokenizer")
    vocab: dict[str, int] = backend.get_vocab(with_added_tokens=True)
    added = backend.get_added_tokens_decoder()
    special = {i for i, t in added.items() if t.special} | set(getattr(tokenizer, "all_special_ids", []) or [])
    if eos_token_id is not None:
        special.add(eos_token_id)
    width = logits_width if logits_width is not None else max(vocab.values()) + 1
    family = _family(backend, vocab)
    table: list[Optional[bytes]] = [None] * width
    for s, i in vocab.items():
        if i >= width or i in special:
            continue
        b = s.encode("utf-8") if i in added else token_str_to_bytes(s, family)
        table[i] = b or None
    return table
