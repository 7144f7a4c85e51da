"""A decoder reranker end to end: a real `launch_server` generation server on a tiny random Qwen3ForCausalLM the
test builds, transformers as the reference (float32). /v1/rerank and /v1/score (vLLM's queries / documents and the
older text_1 / text_2) equal transformers' P(yes) over (no, yes) at the last position of the Qwen3-Reranker prompt;
a per-request instruction replaces the template's; use_activation false is the raw yes - no logit;
truncate_prompt_tokens keeps each pair's last tokens (truncation_side right: its first); /v1/embeddings answers
400 naming --is-embedding, /classify 400 naming a sequence classifier; the server still generates, and its KV pool
is whole after.
"""

from __future__ import annotations

import httpx
import pytest

from server_utils import ServerProcess, assert_idle_and_whole
from tiny_checkpoints import build_tiny

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=512, tie_word_embeddings=True)
FLAGS = ("--dtype", "float32", "--max-total-tokens", "4096", "--debug-check-integrity")


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    root = tmp_path_factory.mktemp("reranker")
    model = build_tiny(root, "Qwen3Config", TINY, {})
    server = ServerProcess("--model-path", str(root), *FLAGS)
    yield model, str(root), server
    server.stop()


def _reference_scores(model, model_dir: str, query: str, docs: list[str], raw: bool = False,
                      keep: int = 0, instruction: str = "") -> list[float]:
    """P(yes) over (no, yes) at the last position; raw: logit(yes) - logit(no); keep: only the last keep tokens
    (keep < 0: the first -keep tokens); instruction: the template's, else Qwen3-Reranker's default."""
    import torch
    from transformers import AutoTokenizer

    from radixlang_runtime.protocol.pooling_input import QWEN3_RERANK_TEMPLATE

    tok = AutoTokenizer.from_pretrained(model_dir)
    no, yes = tok.encode("no", add_special_tokens=False)[0], tok.encode("yes", add_special_tokens=False)[0]
    instruction = instruction or "Given a web search query, retrieve relevant passages that answer the query"
    out = []
    for doc in docs:
        prompt = (QWEN3_RERANK_TEMPLATE.replace("{instruction}", instruction).replace("{query}", query)
                  .replace("{document}", doc))
        with torch.no_grad():
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
            ids = ids[:-keep] if keep < 0 else ids[-keep:]
            logits = model(torch.tensor([ids])).logits[0, -1].double()
        out.append((logits[yes] - logits[no]).item() if raw else torch.softmax(logits[[no, yes]], dim=0)[1].item())
    return out


def test_rerank_and_score_equal_transformers_yes_no(reranker):
    model, model_dir, server = reranker
    query, docs = "what is the capital of France?", ["Paris is the capital of France.", "Bananas are yellow.", "x",
                                                     "{document} braces stay text"]
    ref = _reference_scores(model, model_dir, query, docs)
    out = httpx.post(server.url + "/v1/rerank", json={"query": query, "documents": docs}).json()
    order = sorted(range(len(docs)), key=lambda i: -ref[i])
    assert [r["index"] for r in out["results"]] == order
    assert [r["relevance_score"] for r in out["results"]] == pytest.approx([ref[i] for i in order], abs=1e-4)
    assert [r["document"]["text"] for r in out["results"]] == [docs[i] for i in order]
    short = httpx.post(server.url + "/v1/rerank", json={"query": query, "documents": docs, "top_n": 1,
                                                        "return_documents": False}).json()
    assert short["results"] == [{"index": order[0], "relevance_score": pytest.approx(ref[order[0]], abs=1e-4)}]
    score = httpx.post(server.url + "/v1/score", json={"model": "default", "text_1": query, "text_2": docs}).json()
    assert [s["index"] for s in score["data"]] == [0, 1, 2, 3]
    assert [s["score"] for s in score["data"]] == pytest.approx(ref, abs=1e-4)
    for alias in ("/rerank", "/v2/rerank"):  # vLLM's other names: the same answer
        again = httpx.post(server.url + alias, json={"query": query, "documents": docs}).json()["results"]
        assert [r["index"] for r in again] == order, alias
        assert [r["relevance_score"] for r in again] == pytest.approx([ref[i] for i in order], abs=1e-4)
    again = httpx.post(server.url + "/score", json={"text_1": query, "text_2": docs}).json()["data"]
    assert [s["score"] for s in again] == pytest.approx(ref, abs=1e-4)
    named = httpx.post(server.url + "/score", json={"queries": query, "documents": docs}).json()["data"]
    assert [s["score"] for s in named] == pytest.approx(ref, abs=1e-4)  # vLLM's current names
    zipped = httpx.post(server.url + "/v1/score", json={"queries": [query] * len(docs), "documents": docs}).json()
    zipped = zipped["data"]
    assert [s["score"] for s in zipped] == pytest.approx(ref, abs=1e-4)
    top = httpx.post(server.url + "/v1/rerank", json={"query": query, "documents": docs, "top_n": 0}).json()
    assert len(top["results"]) == len(docs)  # top_n 0: every document, as vLLM
    one = httpx.post(server.url + "/v1/rerank", json={"query": query, "documents": docs[1]}).json()["results"]
    assert [r["relevance_score"] for r in one] == pytest.approx(ref[1:2], abs=1e-4)  # one document as a string
    task = "Decide whether the passage names a city"
    told = _reference_scores(model, model_dir, query, docs, instruction=task)
    assert max(abs(a - b) for a, b in zip(told, ref)) > 1e-3  # the instruction reaches the prompt
    for route, body in (("/v1/rerank", {"query": query, "documents": docs}), ("/v1/score", {"queries": query,
                                                                                           "documents": docs})):
        out = httpx.post(server.url + route, json={**body, "instruction": task}).json()
        got = ([s["score"] for s in out["data"]] if route == "/v1/score" else
               [r["relevance_score"] for r in sorted(out["results"], key=lambda r: r["index"])])
        assert got == pytest.approx(told, abs=1e-4), route


def test_rerank_raw_logits_and_truncation(reranker):
    model, model_dir, server = reranker
    query, docs = "what is the capital of France?", ["Paris is the capital of France.", "Bananas are yellow."]
    raw = _reference_scores(model, model_dir, query, docs, raw=True)
    score = httpx.post(server.url + "/v1/score", json={"text_1": query, "text_2": docs, "use_activation": False})
    assert [s["score"] for s in score.json()["data"]] == pytest.approx(raw, abs=1e-4)
    cut = _reference_scores(model, model_dir, query, docs, keep=20)
    out = httpx.post(server.url + "/v1/rerank", json={"query": query, "documents": docs, "truncate_prompt_tokens": 20,
                                                      "request_id": "r1"}).json()
    assert out["id"] == "rerank-r1" and out["usage"]["prompt_tokens"] == 40
    assert {r["index"]: r["relevance_score"] for r in out["results"]} == pytest.approx(dict(enumerate(cut)), abs=1e-4)
    first = _reference_scores(model, model_dir, query, docs, keep=-20)
    assert max(abs(a - b) for a, b in zip(first, cut)) > 1e-3
    out = httpx.post(server.url + "/v1/score", json={"queries": query, "documents": docs, "truncate_prompt_tokens": 20,
                                                     "truncation_side": "right"}).json()
    assert [s["score"] for s in out["data"]] == pytest.approx(first, abs=1e-4)


@pytest.mark.parametrize("route, body, param", [
    ("/v1/rerank", {"query": "q", "documents": ["a"], "use_activation": 0}, "use_activation"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "truncate_prompt_tokens": -3}, "truncate_prompt_tokens"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "priority": 2}, "priority"),
    ("/v1/score", {"text_1": "a", "text_2": ["c"], "messages": []}, "messages"),  # no chat form for pairs
    ("/v1/score", {"text_1": "a", "text_2": ["c"], "request_id": ["x"]}, "request_id"),
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "truncation_side": "middle"}, "truncation_side"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "cache_salt": ""}, "cache_salt"),
    ("/v1/score", {"queries": "a", "text_2": ["c"]}, "text_1"),  # the current names or the older ones, not a mix
    ("/v1/score", {"queries": ["a", "b"], "documents": ["c", "d", "e"]}, "documents"),
    ("/v1/score", {"documents": ["c"]}, "queries"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "instruction": 3}, "instruction"),
    ("/v1/score", {"queries": "q", "documents": ["a"], "max_tokens_per_doc": 8}, "max_tokens_per_doc"),
    ("/v1/rerank", {"documents": ["a"]}, "query"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2"),
    ("/v1/score", {"text_1": "a", "text_2": ["c"], "text_3": "e"}, "text_3"),
    ("/v1/embeddings", {"input": "x"}, None),
    ("/encode", {"text": "x"}, None),
    ("/classify", {"input": "x"}, None),
])
def test_reranker_server_bad_input_is_400(reranker, route, body, param):
    _, _, server = reranker
    r = httpx.post(server.url + route, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    if route in ("/v1/embeddings", "/encode"):
        assert "--is-embedding" in r.json()["error"]["message"]
    if route == "/classify":
        assert "sequence classifier" in r.json()["error"]["message"]


def test_reranker_server_still_generates_and_is_whole(reranker):
    _, _, server = reranker
    r = httpx.post(server.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 3,
                                                                                     "ignore_eos": True}})
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 3
    assert_idle_and_whole(httpx.Client(base_url=server.url))
