"""Input and output logprobs on the real model (fp32), against transformers' own log_softmax."""

from __future__ import annotations

import pytest

from conftest import PROMPTS

TOL = 2e-4


@pytest.fixture(scope="module")
def hf_logprobs(hf_model):
    import torch

    def run(ids: list[int]) -> "torch.Tensor":
        """[L, V] log_softmax: row i is the distribution of token i + 1."""
        with torch.no_grad():
            return torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)

    return run


def _ids(engine, text):
    return engine.tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("start", [0, 3])
def test_input_and_output_logprobs_match_transformers(engine, hf_logprobs, start):
    ids = _ids(engine, PROMPTS[2])
    out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 6, "min_new_tokens": 6, "temperature": 0},
                          return_logprob=True, logprob_start_len=start, top_logprobs_num=3)
    meta = out["meta_info"]
    ref = hf_logprobs(ids + out["output_ids"])
    inp = meta["input_token_logprobs"]
    if start == 0:
        assert inp[0] == [None, ids[0], None] and meta["input_top_logprobs"][0] is None
        inp, tops = inp[1:], meta["input_top_logprobs"][1:]
    else:
        tops = meta["input_top_logprobs"]
    first = max(start, 0) + 1  # the first token with a value
    assert [t for _, t, _ in inp] == ids[first:]
    for (lp, tok, _), pos in zip(inp, range(first - 1, len(ids) - 1)):
        assert abs(lp - ref[pos, tok].item()) < TOL
    for row, pos in zip(tops, range(first - 1, len(ids) - 1)):
        want = ref[pos].topk(3)
        assert [t for _, t, _ in row] == want.indices.tolist()
        assert all(abs(lp - w) < TOL for (lp, _, _), w in zip(row, want.values.tolist()))
    outs = meta["output_token_logprobs"]
    assert [t for _, t, _ in outs] == out["output_ids"]
    for j, (lp, tok, _) in enumerate(outs):
        assert abs(lp - ref[len(ids) - 1 + j, tok].item()) < TOL
        assert meta["output_top_logprobs"][j][0][1] == tok  # greedy: the chosen token is the top one


def test_select_style_scoring_reuses_the_cache_and_keeps_every_entry(engine, hf_logprobs):
    """The frontend's select: prefill the prefix, then score prefix + each choice from
    logprob_start_len = prompt_tokens - 2 with max_new_tokens 0 (text in logprobs)."""
    assert engine.flush_cache()
    prefix = "Question: what is the colour of the sky on a clear day? Long answer follows here. Answer:"
    warm = engine.generate(prefix, {"max_new_tokens": 0})
    n = warm["meta_info"]["prompt_tokens"]
    choices = [" blue", " green", " a deep shade of red"]
    outs = engine.generate([prefix + c for c in choices], {"max_new_tokens": 0}, return_logprob=True,
                           logprob_start_len=max(n - 2, 0), return_text_in_logprobs=True)
    for c, o in zip(choices, outs):
        ids = _ids(engine, prefix + c)
        ref = hf_logprobs(ids)
        meta = o["meta_info"]
        assert o["output_ids"] == [] and meta["cached_tokens"] >= 16  # the prefix came from the cache
        entries = meta["input_token_logprobs"]
        assert [t for _, t, _ in entries] == ids[n - 1 :]
        assert all(isinstance(text, str) for _, _, text in entries)
        assert "".join(text for _, _, text in entries).endswith(c.strip())
        for (lp, tok, _), pos in zip(entries, range(n - 2, len(ids) - 1)):
            assert abs(lp - ref[pos, tok].item()) < TOL


def test_logprob_arguments_are_validated(engine):
    with pytest.raises(ValueError, match="logprob_start_len"):
        engine.generate("abc", {"max_new_tokens": 1}, return_logprob=True, logprob_start_len=50)
    with pytest.raises(ValueError, match="top_logprobs_num"):
        engine.generate("abc", {"max_new_tokens": 1}, return_logprob=True, top_logprobs_num=-2)
