"""Incremental detokenization equals decoding everything at once, whatever the chunking."""

from __future__ import annotations

import random

import pytest

from radixlang_runtime.protocol.messages import BatchTokenIDOut, ReqConsts, ReqProgress, ReqTokenOut
from radixlang_runtime.detokenize import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import resolve_model_dir

    return AutoTokenizer.from_pretrained(resolve_model_dir(None))


def msg(rid, ids, fin=None, no_trim=False, skip=True, first=True):
    consts = ReqConsts(skip_special_tokens=skip, no_stop_trim=no_trim) if first else None
    return BatchTokenIDOut([ReqTokenOut(rid, ReqProgress(ids, fin, len(ids)), consts=consts)])


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
        out, _ = detok.update(msg("r", chunk, fin, first=pos == len(chunk)))
        assert out.reqs[0].trim == 0
        got += out.reqs[0].text
        if fin is None:
            assert "\ufffd" not in got[-1:] or not got  # incomplete characters wait for the next token
    assert got == tokenizer.decode(ids, skip_special_tokens=True)
    assert detok.states == {}


def test_stop_string_is_trimmed_unless_no_stop_trim(tokenizer):
    ids = tokenizer.encode("The answer is 4. END of story", add_special_tokens=False)
    for no_trim, want in ((False, "The answer is 4."), (True, "The answer is 4. END")):
        detok = IncrementalDetokenizer(tokenizer)
        cut = len(tokenizer.encode("The answer is 4. END", add_special_tokens=False))
        first, _ = detok.update(msg("r", ids[:3], no_trim=no_trim))
        out, _ = detok.update(msg("r", ids[3:cut], {"type": "stop", "matched": " END"}, first=False))
        rec = out.reqs[0]
        assert rec.trim == 0  # the stop string arrived in this record: its text is cut before it is sent
        assert first.reqs[0].text + rec.text == want


def test_a_stop_string_cut_from_text_already_sent_is_a_trim(tokenizer):
    """The stop string's text went out in an earlier record (stop_from_end counts it): the finish sends
    no text and trims those characters; nothing is sent twice."""
    ids = tokenizer.encode("Hello there END", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    sent = detok.update(msg("r", ids))[0].reqs[0].text
    fin = BatchTokenIDOut([ReqTokenOut("r", ReqProgress([], {"type": "stop", "matched": " END"}, len(ids)),
                                       stop_from_end=4)])
    rec = detok.update(fin)[0].reqs[0]
    assert sent == "Hello there END" and rec.text == "" and rec.trim == 4
    assert detok.states == {}


@pytest.mark.parametrize("skip", [False, True])
def test_the_stop_token_that_finished_is_left_out_unless_no_stop_trim(tokenizer, skip):
    """An end-of-turn token kept as text (skip_special_tokens false, as tool formats with special-token
    markup run) is not part of the content once it finished the request; no_stop_trim keeps it."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tokenizer.encode("<tool_call>x</tool_call>", add_special_tokens=False) + [eos]
    for no_trim in (False, True):
        detok = IncrementalDetokenizer(tokenizer)
        first = detok.update(msg("r", ids[:2], no_trim=no_trim, skip=skip))[0].reqs[0].text
        last = detok.update(msg("r", ids[2:], {"type": "stop", "matched": eos}, first=False))[0].reqs[0].text
        want = tokenizer.decode(ids if no_trim else ids[:-1], skip_special_tokens=skip)
        assert first + last == want
        assert want.endswith("<|im_end|>") == (no_trim and not skip)


def test_progress_without_its_first_record_fails_that_request_only(tokenizer):
    detok = IncrementalDetokenizer(tokenizer)
    batch = BatchTokenIDOut(msg("a", [42]).reqs + msg("b", [43], first=False).reqs)
    out, failed = detok.update(batch)
    assert [r.rid for r in out.reqs] == ["a"] and "no constants" in failed["b"]
