"""allowed_token_ids and bad_words on a real server (the embedded model, float32, greedy): allowed_token_ids
gives transformers' greedy decoding with every other logit -inf; bad_words keeps a word that unconstrained
decoding writes out of the output; bad values answer 400 naming the field on /generate and the OpenAI routes."""

from __future__ import annotations

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList

from radixlang_runtime.model.loader.resolve import resolve_model_dir
from radixlang_runtime.protocol.sampling_params import SamplingParams
from server_utils import FP32_FLAGS, assert_idle_and_whole, shared_server

PROMPT = "The capital of France is"
N = 12
GREEDY = {"temperature": 0, "max_new_tokens": N, "ignore_eos": True}


class KeepOnly(LogitsProcessor):
    """Every logit but those of `ids` set to -inf."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(scores, float("-inf"))
        out[:, self.ids] = scores[:, self.ids]
        return out


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_model_dir(None))


@pytest.fixture(scope="module")
def client():
    srv = shared_server(*FP32_FLAGS)
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c


def generate(client, **sampling) -> list[int]:
    r = client.post("/generate", json={"text": PROMPT, "sampling_params": {**GREEDY, **sampling}})
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def contains(seq: list[int], part: list[int]) -> bool:
    return any(seq[i:i + len(part)] == part for i in range(len(seq) - len(part) + 1))


def test_allowed_token_ids_equal_masked_transformers_greedy(client, tok):
    free = generate(client)
    # the unconstrained output's later tokens and a few words, not its first token: the mask must change the text
    words = [t for w in (" Paris", " city", " the", " a", " of", " and", ".") for t in tok.encode(w)]
    allowed = sorted(set(free[1:] + words) - {free[0]})
    out = generate(client, allowed_token_ids=allowed)
    assert set(out) <= set(allowed)
    assert out != free
    model = AutoModelForCausalLM.from_pretrained(resolve_model_dir(None), dtype=torch.float32).eval()
    ids = tok.encode(PROMPT)
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=N, min_new_tokens=N, do_sample=False, eos_token_id=2, pad_token_id=2,
                             logits_processor=LogitsProcessorList([KeepOnly(allowed)]))
    assert out == ref[0, len(ids):].tolist()
    assert_idle_and_whole(client)


def test_bad_words_keep_a_word_of_the_unconstrained_output_out(client, tok):
    free = generate(client)
    # a whole word the unconstrained output writes (a token with a leading space and letters only)
    word = next(t for t in (tok.decode([i]) for i in free) if t.startswith(" ") and t[1:].isalpha())
    sp = SamplingParams.from_dict({"bad_words": [word.strip()]})
    sp.tokenize_bad_words(lambda text: tok.encode(text, add_special_tokens=False))  # what the server bans
    assert any(contains(free, seq) for seq in sp.bad_words_ids)
    out = generate(client, bad_words=[word.strip()])
    assert len(out) == N
    assert [seq for seq in sp.bad_words_ids if contains(out, seq)] == []
    assert out != free
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True,
                                             "bad_words": [word.strip()]})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == tok.decode(out)  # the OpenAI field: the same output
    assert_idle_and_whole(client)


@pytest.mark.parametrize("field,value,message", [
    ("allowed_token_ids", [], "must not be empty"),
    ("allowed_token_ids", [1, 10**7], "out-of-vocab"),
    ("allowed_token_ids", [-1], "allowed_token_ids"),
    ("bad_words", "word", "list of strings"),
    ("bad_words", [" "], "empty or blank"),
])
def test_bad_values_are_400_naming_the_field(client, field, value, message):
    for route, body in (("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, field: value}}),
                        ("/v1/completions", {"prompt": "hi", "max_tokens": 2, field: value}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                  field: value})):
        r = client.post(route, json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field
        assert message in r.json()["error"]["message"]


def test_the_engine_takes_both_fields_as_the_server_does(client, engine):
    fields = {"allowed_token_ids": generate(client)[2:] + [13, 279], "bad_words": ["the"]}
    got = engine.generate(PROMPT, {**GREEDY, **fields})["output_ids"]
    assert got == generate(client, **fields)
    assert set(got) <= set(fields["allowed_token_ids"])
