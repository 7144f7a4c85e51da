"""Incremental detokenization equals decoding everything at once, whatever the chunking."""

from __future__ import annotations

import random

import pytest

from radixlang_runtime.messages import BatchTokenIDOut
from radixlang_runtime.detokenize import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from radixlang_runtime.model.resolve import resolve_model_dir

    return AutoTokenizer.from_pretrained(resolve_model_dir(None))


def msg(rid, ids, fin=None, no_trim=False, skip=True):
    return BatchTokenIDOut([rid], [ids], [fin], [1], [len(ids)], [0], [0], [0.0], [skip], [True], [no_trim])


@pytest.mark.parametrize("seed", range(4))
def test_chunks_of_any_size_give_the_full_decode(tokenizer, seed):
    rng = random.Random(seed)
    text = "Grüße aus Köln — ünïcödé ✓ 漢字 emoji 🎉🚀 and plain words, numbers 12345.\n" * 3
    ids = tokenizer.encode(text, add_special_tokens=False)
    if seed % 2:  # random ids too: byte-level pieces that split UTF-8 characters
        ids = ids + [rng.randrange(0, 49152) for _ in range(40)]
    detok = IncrementalDetokenizer(tokenizer)
    got, pos = "", 0
    while pos < len(ids):
        n = rng.randrange(1, 5)
        chunk = ids[pos : pos + n]
        pos += n
        fin = {"type": "length", "length": len(ids)} if pos >= len(ids) else None
        out, _ = detok.update(msg("r", chunk, fin))
        assert not out.text_is_full[0]
        got += out.texts[0]
        if fin is None:
            assert "\ufffd" not in got[-1:] or not got  # incomplete characters wait for the next token
    assert got == tokenizer.decode(ids, skip_special_tokens=True)
    assert detok.states == {}


def test_stop_string_is_trimmed_unless_no_stop_trim(tokenizer):
    ids = tokenizer.encode("The answer is 4. END of story", add_special_tokens=False)
    for no_trim, want in ((False, "The answer is 4."), (True, "The answer is 4. END")):
        detok = IncrementalDetokenizer(tokenizer)
        cut = len(tokenizer.encode("The answer is 4. END", add_special_tokens=False))
        detok.update(msg("r", ids[:3]))
        out, _ = detok.update(msg("r", ids[3:cut], {"type": "stop", "matched": " END"}, no_trim=no_trim))
        assert out.text_is_full[0] is (not no_trim)
        text = out.texts[0] if out.text_is_full[0] else tokenizer.decode(ids[:3]) + out.texts[0]
        assert text == want
