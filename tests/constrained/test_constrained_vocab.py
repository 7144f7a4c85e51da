"""TokenVocab: raw bytes per token id (GPT-2 byte table undone, SentencePiece pieces and byte tokens),
special tokens and EOS left out, width = the logits width, the end sentinel, stable tokenizer ids."""

from __future__ import annotations

import sys
import subprocess

import pytest
from test_constrained_helpers import EOS, encode, logits_width, tokenizer, vocab

from radixlang_runtime.constrained.vocab import TokenVocab, token_str_to_bytes, vocab_from_tokenizer


@pytest.mark.parametrize("text", ["Hello, world!", " leading space\n\tand tabs", "Grüße aus Köln — ✓ 漢字",
                                  "emoji 🎉🚀", '{"k": [1, 2.5e-3, null]}', "\\\"escaped\\\""])
def test_token_bytes_concatenate_to_the_text(text):
    assert vocab().bytes_of(encode(text)) == text.encode("utf-8")


def test_special_tokens_eos_and_width():
    v = vocab()
    assert v.logits_width == logits_width() == 49152 and len(v.token_bytes) == v.logits_width
    assert v.eos_token_id == EOS and v.token_bytes[EOS] is None
    assert all(v.token_bytes[i] is None for i in range(17))  # <|endoftext|> ... <empty_output>
    assert v.token_bytes[encode(" the")[0]] == b" the"
    assert v.token_bytes[encode("\n")[0]] == b"\n"
    bm = v.byte_map()
    assert all(EOS not in ids for ids in bm.values())
    assert bm[v.sentinel.encode()] == [v.sentinel_id] and v.sentinel_id == v.logits_width
    lead = v.sentinel.encode()[0]
    assert not any(b and lead in b for b in v.token_bytes)  # no text token can spell the sentinel
    assert all(v.single_byte_ids[b] >= 0 for b in range(0x20, 0x7F))
    assert v.first_byte[encode("{")[0]] == ord("{") and v.first_byte[EOS] == -1


def test_width_and_tokenizer_id():
    wide = vocab_from_tokenizer(tokenizer(), 49160, EOS)
    narrow = vocab_from_tokenizer(tokenizer(), 40000, EOS)
    assert wide.token_bytes[49152:] == (None,) * 8 and wide.token_bytes[:49152] == vocab().token_bytes
    assert len(narrow.token_bytes) == 40000
    ids = {vocab().tokenizer_id, wide.tokenizer_id, narrow.tokenizer_id}
    assert len(ids) == 3
    assert vocab_from_tokenizer(tokenizer(), 49152, EOS).tokenizer_id == vocab().tokenizer_id


def test_ids_with_prefix():
    v = vocab()
    ids = v.ids_with_prefix(b'"', 1)
    assert len(ids) > 10 and all(v.token_bytes[i].startswith(b'"') and len(v.token_bytes[i]) > 1 for i in ids)
    assert set(v.ids_with_prefix(b'"', 0).tolist()) == {i for i, b in enumerate(v.token_bytes) if b and b[:1] == b'"'}
    assert len(v.ids_with_prefix(b"\xff", 0)) == 0


@pytest.mark.parametrize("s, family, out", [
    ("Ġhello", "byte_level", b" hello"), ("Ċ", "byte_level", b"\n"), ("Ã©", "byte_level", b"\xc3\xa9"),
    ("<special>", "byte_level", b"<special>"),
    ("▁hello", "sentencepiece", b" hello"), ("<0x0A>", "sentencepiece", b"\n"), ("<0xE6>", "sentencepiece", b"\xe6"),
    ("plain", "plain", b"plain"),
])
def test_token_string_families(s, family, out):
    assert token_str_to_bytes(s, family) == out


def test_sentencepiece_style_tokenizer():
    from tokenizers import Tokenizer, decoders, models

    pieces = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁a": 3, "b": 4, "<0x0A>": 5, "<0xC3>": 6, "▁": 7}
    tok = Tokenizer(models.BPE(vocab=pieces, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    v = vocab_from_tokenizer(tok, 8, eos_token_id=2)
    assert v.token_bytes == (None, None, None, b" a", b"b", b"\n", b"\xc3", b" ")


def test_vocab_needs_an_eos_and_a_fast_tokenizer():
    with pytest.raises(ValueError, match="eos_token_id"):
        vocab_from_tokenizer(tokenizer(), 49152)
    with pytest.raises(TypeError, match="fast"):
        vocab_from_tokenizer(object(), 10, 0)
    with pytest.raises(AssertionError):
        TokenVocab([b"a", b"b"], eos_token_id=1)  # EOS must not be a text token


def test_transformers_style_wrapper_is_accepted():
    class Wrapper:  # what a transformers fast tokenizer exposes
        backend_tokenizer = tokenizer()
        eos_token_id = EOS
        all_special_ids = [0, 1, 2]

    assert vocab_from_tokenizer(Wrapper(), 49152).tokenizer_id == vocab().tokenizer_id


def test_compile_side_modules_do_not_import_torch():
    code = ("import sys\n"
            "import radixlang_runtime.constrained.worker_child, radixlang_runtime.constrained.cache\n"
            "import radixlang_runtime.constrained.jump_forward, radixlang_runtime.constrained.spec\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
