"""What agent frameworks send to /v1: logit_bias (OpenAI and native), tools / tool_choice with parsed
tool calls, tool results in the history. A real server on the embedded model (float32, so greedy
tokens are compared with transformers on the same weights), the `openai` SDK and httpx as clients."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from server_utils import ServerProcess


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--dtype", "float32", "--max-total-tokens", "8192")
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120)


def hf_biased(hf_model, ids: list[int], n: int, bias: dict[int, float]) -> list[int]:
    """transformers' greedy continuation with `bias` added to the logits at every step."""

    def add_bias(_input_ids, scores):
        scores = scores.clone()
        for t, b in bias.items():
            scores[:, t] += b
        return scores

    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=2,
                                logits_processor=[add_bias])
    return out[0, len(ids):].tolist()


# ------------------------------------------------------------------------------------ logit_bias
def test_logit_bias_plus_100_forces_a_token_under_greedy(client, oai, engine_fp32):
    tok = engine_fp32.tokenizer
    forced = tok.encode(" banana", add_special_tokens=False)[0]
    sp = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True, "logit_bias": {str(forced): 100}}
    out = client.post("/generate", json={"text": "The capital of France is", "sampling_params": sp}).json()
    assert out["output_ids"] == [forced] * 4
    c = oai.completions.create(model="default", prompt="The capital of France is", max_tokens=3, temperature=0,
                               logit_bias={str(forced): 100})
    assert c.choices[0].text == tok.decode([forced] * 3)


def test_logit_bias_minus_100_on_the_greedy_token_matches_transformers(client, oai, engine_fp32, hf_model,
                                                                       hf_greedy):
    tok = engine_fp32.tokenizer
    text = "The capital of France is"
    ids = tok.encode(text, add_special_tokens=False)
    plain = hf_greedy(ids, 6)
    bias = {plain[0]: -100.0}
    want = hf_biased(hf_model, ids, 6, bias)
    assert want[0] != plain[0]
    sp = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True, "logit_bias": {str(plain[0]): -100}}
    out = client.post("/generate", json={"text": text, "sampling_params": sp}).json()
    assert out["output_ids"] == want
    # the chat route takes it too (the same mechanism: one more request, checked against transformers)
    msgs = [{"role": "user", "content": "Name a fruit."}]
    chat_ids = tok.encode(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                          add_special_tokens=False)
    first = hf_greedy(chat_ids, 1)[0]
    want = hf_biased(hf_model, chat_ids, 4, {first: -100.0})
    r = oai.chat.completions.create(model="default", messages=msgs, max_tokens=4, temperature=0,
                                    logit_bias={str(first): -100}, extra_body={"ignore_eos": True})
    assert r.choices[0].message.content == tok.decode(want)


@pytest.mark.parametrize("bias,needle", [
    ({"1": 100.5}, "logit_bias"), ({"1": "x"}, "logit_bias"), ({"-3": 1}, "logit_bias"),
    ({"abc": 1}, "logit_bias"), ({"1000000": 1}, "logit_bias keys must be token ids in [0, "), ([1, 2], "logit_bias"),
])
def test_bad_logit_bias_is_a_400_naming_it(client, bias, needle):
    for route, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
                        ("/v1/completions", {"prompt": "hi", "max_tokens": 1}),
                        ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}})):
        if route == "/generate":
            body = {**body, "sampling_params": {**body["sampling_params"], "logit_bias": bias}}
        else:
            body = {**body, "logit_bias": bias}
        r = client.post(route, json=body)
        assert r.status_code == 400, (route, r.text)
        err = r.json()["error"]
        assert needle in err["message"], (route, err)
        assert err["param"].endswith("logit_bias"), (route, err)
