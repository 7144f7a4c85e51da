"""return_hidden_states on a real server (--enable-return-hidden-states, float32, the overlap schedule, prefill
chunks of 32 tokens): meta_info.hidden_states is SGLang's shape (the prompt's rows, then one row per generated
token but the last) and equals transformers' final-norm output over the same tokens; the head on those rows gives
the greedy tokens the server sampled; the rows do not come from the prefix cache; requests batched beside one
that asks are unchanged; a /generate batch takes one flag per prompt (a list) and returns them for the prompts
that asked only; streaming /generate carries them in its final event; the OpenAI routes give each choice
the last row; a bad value or a streamed OpenAI request is a 400 naming the field, and a server without the flag
refuses the field naming the flag."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from server_utils import HIDDEN_FLAGS, assert_idle_and_whole, shared_server, sse_events

PROMPT = ("The old lighthouse keeper climbed the spiral stairs every evening, counting each step aloud, and watched "
          "the fishing boats come home past the rocky point while the gulls circled above the harbour walls.")
N = 6
GREEDY = {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def client():
    srv = shared_server(*HIDDEN_FLAGS)
    with httpx.Client(base_url=srv.url, timeout=180) as c:
        yield c
        assert_idle_and_whole(c)


def generate(client, text: str = PROMPT, **fields) -> dict:
    r = client.post("/generate", json={"text": text, "sampling_params": GREEDY, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def reference(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model.model(torch.tensor([ids])).last_hidden_state[0]


def rows_of(hidden_states: list) -> torch.Tensor:
    return torch.tensor([*hidden_states[0], *hidden_states[1:]])


def test_hidden_states_are_transformers_final_norm_output(client, hf_model, engine_fp32):
    out = generate(client, return_hidden_states=True)
    meta, ids = out["meta_info"], engine_fp32.tokenizer.encode(PROMPT)
    hs = meta["hidden_states"]
    assert meta["prompt_tokens"] == len(ids) > 32  # more than one prefill chunk
    assert len(hs) == N and len(hs[0]) == len(ids)  # the prompt's rows, then one per generated token but the last
    hidden_size = hf_model.config.hidden_size
    assert all(len(r) == hidden_size for r in hs[0]) and all(len(r) == hidden_size for r in hs[1:])
    got = rows_of(hs)
    torch.testing.assert_close(got, reference(hf_model, ids + out["output_ids"][:-1]), rtol=1e-3, atol=1e-3)
    with torch.no_grad():
        picked = hf_model.lm_head(got[len(ids) - 1:]).argmax(-1).tolist()
    assert picked == out["output_ids"]
    again = generate(client, return_hidden_states=True)  # the prompt is cached now: its rows are computed again
    assert again["meta_info"]["cached_tokens"] == 0
    torch.testing.assert_close(rows_of(again["meta_info"]["hidden_states"]), got, rtol=1e-4, atol=1e-4)
    assert again["output_ids"] == out["output_ids"]
    assert_idle_and_whole(client)


def test_requests_batched_beside_are_unchanged(client):
    prompts = [f"{PROMPT} Chapter {k}." for k in range(4)]
    alone = [generate(client, p) for p in prompts]
    jobs = [(p, asks) for p in prompts for asks in (True, False)]  # sent at once: they share steps
    with ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(pool.map(lambda job: generate(client, job[0], return_hidden_states=job[1]), jobs))
    asked, plain = outs[0::2], outs[1::2]
    for a, h, p in zip(alone, asked, plain):
        assert h["output_ids"] == a["output_ids"] == p["output_ids"]
        assert "hidden_states" not in p["meta_info"] and "hidden_states" not in a["meta_info"]
        assert len(h["meta_info"]["hidden_states"]) == N
    assert_idle_and_whole(client)


def test_a_batch_returns_them_for_the_prompts_that_asked(client):
    prompts = [f"{PROMPT} Part {k}." for k in range(3)]
    r = client.post("/generate", json={"text": prompts, "sampling_params": {**GREEDY, "n": 2},
                                       "return_hidden_states": [True, False, True]})
    assert r.status_code == 200, r.text
    outs = r.json()
    assert len(outs) == 6  # prompt * n + sample: a prompt's samples share its flag
    assert ["hidden_states" in o["meta_info"] for o in outs] == [True, True, False, False, True, True]
    for k in (0, 1, 4, 5):
        assert len(outs[k]["meta_info"]["hidden_states"]) == N
    alone = generate(client, prompts[2], return_hidden_states=True)
    torch.testing.assert_close(rows_of(outs[4]["meta_info"]["hidden_states"]),
                               rows_of(alone["meta_info"]["hidden_states"]), rtol=1e-3, atol=1e-3)
    bad = client.post("/generate", json={"text": prompts, "sampling_params": GREEDY,
                                         "return_hidden_states": [True, False]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "return_hidden_states", bad.text
    assert "has 2 entries for 3 prompts" in bad.json()["error"]["message"]
    bad = client.post("/generate", json={"text": prompts, "sampling_params": GREEDY,
                                         "return_hidden_states": [True, 1, False]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "return_hidden_states[1]", bad.text
    assert_idle_and_whole(client)


def test_streaming_generate_ends_with_them(client):
    whole = generate(client, return_hidden_states=True)
    body = {"text": PROMPT, "sampling_params": GREEDY, "return_hidden_states": True, "stream": True}
    with client.stream("POST", "/generate", json=body) as r:
        events = sse_events(r.iter_lines())[:-1]
    assert all("hidden_states" not in e["meta_info"] for e in events[:-1])
    torch.testing.assert_close(rows_of(events[-1]["meta_info"]["hidden_states"]),
                               rows_of(whole["meta_info"]["hidden_states"]), rtol=1e-4, atol=1e-4)


def test_openai_choices_carry_the_last_row(client):
    whole = generate(client, return_hidden_states=True)
    last = torch.tensor(whole["meta_info"]["hidden_states"][-1])
    comp = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": N, "temperature": 0,
                                                "ignore_eos": True, "return_hidden_states": True, "n": 2})
    assert comp.status_code == 200, comp.text
    for choice in comp.json()["choices"]:
        torch.testing.assert_close(torch.tensor(choice["hidden_states"]), last, rtol=1e-4, atol=1e-4)
    one = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "return_hidden_states": True})
    assert one.json()["choices"][0]["hidden_states"] == []  # only the prompt ran
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": PROMPT}],
                                                     "max_tokens": 3, "return_hidden_states": True})
    assert chat.status_code == 200, chat.text
    assert len(chat.json()["choices"][0]["hidden_states"]) == len(last)
    plain = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": PROMPT}],
                                                      "max_tokens": 3})
    assert "hidden_states" not in plain.json()["choices"][0]


@pytest.mark.parametrize("route,body", [
    ("/generate", {"text": "Hi", "sampling_params": GREEDY, "return_hidden_states": "yes"}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "return_hidden_states": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                              "return_hidden_states": True, "stream": True}),
])
def test_refusals_name_the_field(client, route, body):
    r = client.post(route, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "return_hidden_states", r.text


def test_without_the_flag_the_field_names_it(engine_fp32):
    with pytest.raises(ValueError, match="--enable-return-hidden-states"):
        engine_fp32.generate(PROMPT, GREEDY, return_hidden_states=True)
    out = engine_fp32.generate(PROMPT, GREEDY, return_hidden_states=False)
    assert "hidden_states" not in out["meta_info"]
