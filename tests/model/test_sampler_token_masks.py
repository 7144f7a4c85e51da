"""allowed_token_ids and bad_words (vLLM's sampling fields) on synthetic logits: the masks, their intake
checks, the tokenization rule, and the verify rows of a draft."""

from __future__ import annotations

import pytest
import torch

from radixlang_runtime.model.executor.sample_step import sample_step
from radixlang_runtime.model.executor.sampler import Sampler
from radixlang_runtime.model.executor.step_io import ModelBatch, SampleSpec, StepResult
from radixlang_runtime.protocol.limits import FieldError
from radixlang_runtime.protocol.sampling_params import SamplingParams

V = 8
EOS = 7
LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -2.0, -3.0, 1.5])  # argmax 0, then 7, 1, 2, ...


def spec(out=(), bad_ids=None, **sp) -> SampleSpec:
    params = SamplingParams.from_dict(sp)
    params.bad_words_ids = bad_ids
    return SampleSpec(params, input_ids=[1, 2], output_ids=list(out))


def run(reqs: list[SampleSpec], seed: int = 0) -> tuple[list[int], torch.Tensor]:
    logits = LOGITS.repeat(len(reqs), 1)
    toks = Sampler(V, [EOS], torch.device("cpu"), seed).sample(logits, reqs)
    return toks, logits


def test_allowed_token_ids_mask_every_other_token_greedy_and_sampled():
    toks, logits = run([spec(temperature=0.0, allowed_token_ids=[3, 5, 2]), spec(temperature=0.0)])
    assert toks == [2, 0]  # the best allowed token; the unmasked row keeps its argmax
    exp = torch.full((V,), float("-inf"))
    exp[[2, 3, 5]] = LOGITS[[2, 3, 5]]
    assert torch.equal(logits[0], exp)
    assert torch.equal(logits[1], LOGITS)  # a row without the field is untouched
    drawn, _ = run([spec(temperature=5.0, allowed_token_ids=[4, 6]) for _ in range(400)], seed=3)
    assert set(drawn) == {4, 6}  # a hot temperature still draws only allowed tokens (both of them)


def test_logit_bias_cannot_lift_a_masked_token():
    toks, logits = run([spec(temperature=0.0, allowed_token_ids=[1, 2], logit_bias={"0": 100, "3": 100})])
    assert toks == [1]
    assert logits[0, 0].item() == float("-inf")
    assert logits[0, 3].item() == float("-inf")


def test_one_token_bad_word_is_always_banned():
    toks, logits = run([spec(temperature=0.0, bad_ids=[[0]]), spec(temperature=0.0)])
    assert toks == [7, 0]
    assert logits[0, 0].item() == float("-inf")
    assert torch.equal(logits[0, 1:], LOGITS[1:])
    assert torch.equal(logits[1], LOGITS)


def test_multi_token_bad_word_bans_its_last_token_only_after_the_rest():
    word = [[4, 5, 0]]
    after_prefix, _ = run([spec(out=[3, 4, 5], temperature=0.0, bad_ids=word)])
    assert after_prefix == [7]
    for out in ([], [5], [4], [5, 4], [4, 5, 1], [4, 4]):  # the output does not end with 4, 5
        toks, logits = run([spec(out=out, temperature=0.0, bad_ids=word)])
        assert toks == [0]
        assert torch.equal(logits[0], LOGITS)
    toks, _ = run([spec(out=[4, 5], temperature=0.0, bad_ids=[[9, 1], [4, 5, 0], [5, 7]])])
    assert toks == [1]  # two words end here: 0 and 7 are banned, [9, 1] is not


def test_masks_with_the_min_new_tokens_suppression_and_penalties():
    toks, logits = run([spec(temperature=0.0, min_new_tokens=2, allowed_token_ids=[7, 3], presence_penalty=1.0,
                             out=[3])])
    assert toks == [3]  # EOS (7) suppressed before min_new_tokens; 3 stays the only choice despite the penalty
    assert logits[0, 3].item() == pytest.approx(-1.0)


def test_draft_rows_see_the_draft_before_them_for_bad_words():
    """A draft [4, 5] verified against the word [4, 5, 0]: row 2 (after 4, 5) bans 0, rows 0 and 1 do not."""
    specs = [spec(out=[1], temperature=0.0, bad_ids=[[4, 5, 0]])]
    specs[0].draft = [4, 5]
    batch = ModelBatch("decode", ["r"], [0], [3], [[1, 4, 5]], [[0, 1, 2]], [], specs, [None])
    rows = torch.full((3, V), -5.0)
    rows[0, 4] = rows[1, 5] = 1.0  # the model agrees with the draft
    rows[2, 0], rows[2, 6] = 3.0, 2.0  # then wants 0, which completes the word
    result = StepResult()
    sample_step(batch, [0], [3], rows, Sampler(V, [EOS], torch.device("cpu"), 0), result)
    assert result.accepted == {0: 2}
    assert result.next_token_ids == [6]


def test_allowed_token_ids_checks_name_the_field():
    for bad in ([], [-1], [1, "2"], [True], 5):
        with pytest.raises(FieldError, match="allowed_token_ids") as e:
            SamplingParams.from_dict({"allowed_token_ids": bad})
        assert e.value.param == "allowed_token_ids"
    sp = SamplingParams.from_dict({"allowed_token_ids": [0, V - 1]})
    sp.check_vocab(V)
    sp = SamplingParams.from_dict({"allowed_token_ids": [1, V, V + 3]})
    with pytest.raises(FieldError, match=r"out-of-vocab token ids .*\[8, 11\]") as e:
        sp.check_vocab(V)
    assert e.value.param == "allowed_token_ids"


def test_bad_words_checks_name_the_field():
    for bad in ("word", [""], ["  "], [3], ["a\ud800"], ["w"] * 129):
        with pytest.raises(FieldError, match="bad_words") as e:
            SamplingParams.from_dict({"bad_words": bad})
        assert e.value.param == "bad_words"
    with pytest.raises(FieldError, match="unknown sampling parameter"):
        SamplingParams.from_dict({"bad_words_ids": [[1]]})  # built on intake, never sent
    sp = SamplingParams.from_dict({"bad_words": ["hi"]})
    with pytest.raises(FieldError, match="tokenizer") as e:
        sp.tokenize_bad_words(None)
    assert e.value.param == "bad_words"
    sp.tokenize_bad_words(lambda text: [V + 1] if text == "hi" else [2])
    with pytest.raises(FieldError, match=r"bad_words .*\[9\]"):
        sp.check_vocab(V)


def test_bad_words_tokenize_with_and_without_a_leading_space_as_vllm():
    vocab = {"cat": [10], " cat": [11], "dog": [20, 21], " dog": [22, 23, 24], "x y": [30, 31], " x y": [30, 31],
             "eel": [40], " eel": [41, 42]}
    sp = SamplingParams.from_dict({"bad_words": ["  cat", "dog", "x y", "eel"]})
    sp.tokenize_bad_words(lambda text: vocab[text])
    # " cat": same length, another first token: kept; " dog" / " eel": another length, " x y": the same first
    # token: dropped (vLLM's update_from_tokenizer)
    assert sp.bad_words_ids == [[10], [11], [20, 21], [30, 31], [40]]
    wire = sp.to_wire()  # the scheduler gets the token sequences and never tokenizes
    assert wire["bad_words_ids"] == [[10], [11], [20, 21], [30, 31], [40]]
    assert SamplingParams.from_wire(wire).bad_words_ids == sp.bad_words_ids
