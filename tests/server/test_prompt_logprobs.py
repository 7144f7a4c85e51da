"""vLLM's prompt_logprobs on /v1/completions (per choice) and /v1/chat/completions (once, on the response),
on a real float32 server: the entries equal native /generate's input logprobs for the same ids, the values
and ranks agree with transformers' float32 log_softmax, top_logprobs and prompt_logprobs sharing one request
each keep their own count, and the refusals (-1, out of range, with stream) name the field."""

from __future__ import annotations

import re

import httpx
import pytest

from server_utils import FP32_FLAGS, shared_server

TOL = 2e-4
PROMPT = "The capital of France is Paris, and the capital of Italy is"
CHAT = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def client():
    srv = shared_server(*FP32_FLAGS)
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def hf():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radixlang_runtime.model.loader.resolve import resolve_model_dir

    path = resolve_model_dir(None)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def log_softmax(ids: list[int]) -> "torch.Tensor":
        """[L, V]: row i is the distribution of token i + 1."""
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)

    return AutoTokenizer.from_pretrained(path), log_softmax


def _native(client, ids: list[int], top: int) -> dict:
    """/generate's input logprobs of ids from position 0 (with text), its meta_info."""
    r = client.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                                       "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": top,
                                       "return_text_in_logprobs": True})
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def _assert_same_as_native(plp: list, ids: list[int], meta: dict, top: int) -> None:
    """prompt_logprobs entry i: the prompt token's native entry first, then the native top row (rank 1..top)."""
    entries, rows = meta["input_token_logprobs"], meta["input_top_logprobs"]
    assert len(plp) == len(ids) == len(entries) and plp[0] is None
    for i in range(1, len(ids)):
        d = plp[i]
        value, tid, text = entries[i]
        assert tid == ids[i] and next(iter(d)) == str(tid)
        assert d[str(tid)]["logprob"] == value and d[str(tid)]["decoded_token"] == text
        assert set(d) == {str(tid)} | {str(t) for _, t, _ in rows[i]} and len(rows[i]) == top
        for v, t, s in rows[i]:
            assert d[str(t)]["logprob"] == v and d[str(t)]["decoded_token"] == s
        # an alternative's rank is its place in the top row (the prompt token's own rank: _assert_matches_transformers)
        alternatives = [(rank, t) for rank, (_, t, _) in enumerate(rows[i], 1) if t != tid]
        assert [d[str(t)]["rank"] for _, t in alternatives] == [rank for rank, _ in alternatives]


def _assert_matches_transformers(plp: list, ids: list[int], ref) -> None:
    """Each prompt token's logprob within TOL of transformers', its rank between the counts of entries above
    it by more than TOL and above it at all (near-ties may order either way); the model's top token is there
    at rank 1 (top >= 1)."""
    for i in range(1, len(ids)):
        row, entry = ref[i - 1], plp[i][str(ids[i])]
        assert abs(entry["logprob"] - row[ids[i]].item()) < TOL
        above_clearly, above = int((row > entry["logprob"] + TOL).sum()), int((row > entry["logprob"] - TOL).sum())
        assert 1 + above_clearly <= entry["rank"] <= 1 + above
        best = plp[i][str(int(row.argmax()))]
        assert best["rank"] == 1 and abs(best["logprob"] - row.max().item()) < TOL
    assert max(plp[i][str(ids[i])]["rank"] for i in range(1, len(ids))) > 1  # not every token the top one


def test_completions_prompt_logprobs_match_generate_and_transformers(client, hf):
    tok, log_softmax = hf
    ids = tok.encode(PROMPT, add_special_tokens=False)
    r = client.post("/v1/completions", json={"model": "default", "prompt": ids, "max_tokens": 2, "temperature": 0,
                                             "n": 2, "prompt_logprobs": 3})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 2 and choices[0]["prompt_logprobs"] == choices[1]["prompt_logprobs"]
    assert choices[0]["logprobs"] is None
    plp = choices[0]["prompt_logprobs"]
    _assert_same_as_native(plp, ids, _native(client, ids, 3), 3)
    _assert_matches_transformers(plp, ids, log_softmax(ids))
    # a text prompt: the same entries (its ids as the server tokenizes them)
    text = client.post("/v1/completions", json={"model": "default", "prompt": PROMPT, "max_tokens": 1,
                                                "prompt_logprobs": 3}).json()["choices"][0]["prompt_logprobs"]
    assert text == plp
    # 0: only the prompt token itself
    zero = client.post("/v1/completions", json={"model": "default", "prompt": ids, "max_tokens": 1,
                                                "prompt_logprobs": 0}).json()["choices"][0]["prompt_logprobs"]
    assert zero == [None] + [{str(t): plp[i][str(t)]} for i, t in enumerate(ids) if i]
    plain = client.post("/v1/completions", json={"model": "default", "prompt": ids, "max_tokens": 1}).json()
    assert "prompt_logprobs" not in plain["choices"][0]


def test_prompt_logprobs_with_echo_and_logprobs_keep_their_own_counts(client):
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 3, "min_tokens": 3, "temperature": 0,
            "echo": True, "logprobs": 4, "prompt_logprobs": 1}
    c = client.post("/v1/completions", json=body).json()["choices"][0]
    lp, plp = c["logprobs"], c["prompt_logprobs"]
    n = len(plp)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(len(row) == 4 for row in lp["top_logprobs"][1:])
    assert all(1 <= len(d) <= 2 for d in plp[1:])
    assert [d[next(iter(d))]["logprob"] for d in plp[1:]] == lp["token_logprobs"][1:n]
    assert lp["top_logprobs"][n:] == client.post("/v1/completions", json={
        **body, "echo": False, "prompt_logprobs": None}).json()["choices"][0]["logprobs"]["top_logprobs"]
    # prompt_logprobs asks more alternatives than logprobs: the echoed rows keep logprobs' count
    wide = client.post("/v1/completions", json={**body, "logprobs": 1, "prompt_logprobs": 5}).json()["choices"][0]
    assert all(len(row) == 1 for row in wide["logprobs"]["top_logprobs"][1:])
    assert all(5 <= len(d) <= 6 for d in wide["prompt_logprobs"][1:])
    none_top = client.post("/v1/completions", json={**body, "echo": False, "logprobs": 0, "prompt_logprobs": 2})
    assert none_top.json()["choices"][0]["logprobs"]["top_logprobs"] == [None, None, None]


def test_chat_prompt_logprobs_on_the_response(client, hf):
    tok, log_softmax = hf
    ids = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    body = {"model": "default", "messages": CHAT, "max_tokens": 3, "temperature": 0, "n": 2,
            "logprobs": True, "top_logprobs": 2, "prompt_logprobs": 4}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    plp = out["prompt_logprobs"]
    assert out["usage"]["prompt_tokens"] == len(ids) and all("prompt_logprobs" not in c for c in out["choices"])
    _assert_same_as_native(plp, ids, _native(client, ids, 4), 4)
    _assert_matches_transformers(plp, ids, log_softmax(ids))
    assert all(len(x["top_logprobs"]) == 2 for c in out["choices"] for x in c["logprobs"]["content"])
    plain = client.post("/v1/chat/completions", json={**body, "prompt_logprobs": None}).json()
    assert "prompt_logprobs" not in plain
    assert plain["choices"][0]["logprobs"] == out["choices"][0]["logprobs"]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("value,stream,says", [(-1, False, "whole vocabulary"), (-2, False, "in \\[0, 20\\]"),
                                               (21, False, "in \\[0, 20\\]"), ("3", False, "integer"),
                                               (True, False, "integer"), (0, True, "stream"), (2, True, "stream")])
def test_prompt_logprobs_refusals_name_the_field(client, route, value, stream, says):
    body = {"model": "default", "max_tokens": 1, "prompt_logprobs": value, "stream": stream,
            **({"prompt": "Hi"} if route == "/v1/completions" else {"messages": CHAT})}
    r = client.post(route, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "prompt_logprobs"
    assert re.search(says, err["message"]), err["message"]
