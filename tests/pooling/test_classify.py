"""Sequence classifiers end to end: real `launch_server` processes on tiny random *ForSequenceClassification
checkpoints saved by transformers in the test, transformers' logits as the reference (float32).

- Qwen3, three labels, served without --is-embedding (the architecture makes it a pooling model): /classify and
  /v1/classify probs equal softmax(logits) for strings, a batch, token arrays, truncate_prompt_tokens; labels from
  id2label; bad input answers 400 naming the field; generation and embedding routes refused; score refused;
- Llama, one label (a reward model), with --is-embedding: probs are sigmoid(logit); /v1/score and /v1/rerank
  score (query, document) pairs as a cross-encoder, sigmoid of the logit of the tokenizer's pair encoding;
- Qwen2, two labels, problem_type multi_label_classification: a sigmoid per label;
- Gemma 2, two labels: its decoder (embedding scale, Gemma norms, soft-capped attention) under the score head.
vLLM's fields: chat `messages` classify the template's tokens, use_activation false answers the logits (and the
cross-encoder's raw logit on /v1/score), truncate_prompt_tokens on rerank keeps each pair's last tokens.
After each server's scenarios its KV pool is whole.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from server_utils import ServerProcess, assert_idle_and_whole
from tiny_checkpoints import REFERENCE_ATTENTION

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=512)
FLAGS = ("--dtype", "float32", "--max-total-tokens", "4096", "--debug-check-integrity")
TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "a", "Classifiers read the last token."]
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
PAD = 0  # the Qwen3 classifier's pad_token_id (<|endoftext|>)


def _build(root, config_cls: str, model_cls: str, extra: dict):
    """A random classifier (its score head drawn wide, so the probabilities spread) saved with the tokenizer."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    cfg = getattr(transformers, config_cls)(vocab_size=len(tok), **TINY, **extra)
    cfg._attn_implementation = REFERENCE_ATTENTION
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).to(torch.float32).eval()
    with torch.no_grad():
        model.score.weight.normal_(0.0, 0.2)  # logits of order one: no saturated probability
    model.save_pretrained(root, safe_serialization=True)
    tok.save_pretrained(root)
    return model, tok


def _logits(model, ids: list[int]):
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double()  # [num_labels]


BUILDS = {
    "qwen3": ("Qwen3Config", "Qwen3ForSequenceClassification", {"id2label": LABELS,
                                                                 "label2id": {v: k for k, v in LABELS.items()},
                                                                 "pad_token_id": PAD},
              ()),
    "llama": ("LlamaConfig", "LlamaForSequenceClassification", {"num_labels": 1}, ("--is-embedding",)),
    "qwen2": ("Qwen2Config", "Qwen2ForSequenceClassification",
              {"num_labels": 2, "problem_type": "multi_label_classification"}, ()),
    "gemma2": ("Gemma2Config", "Gemma2ForSequenceClassification", {"num_labels": 2, "query_pre_attn_scalar": 16,
                                                                    "pad_token_id": PAD}, ()),
    # a sliding layer (a window of 4 positions: shorter than most TEXTS) under a global one, each its own rope
    "gemma3": ("Gemma3TextConfig", "Gemma3TextForSequenceClassification",
               {"num_labels": 3, "query_pre_attn_scalar": 16, "pad_token_id": PAD, "sliding_window": 4,
                "layer_types": ["sliding_attention", "full_attention"]}, ()),
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """A server per build, started at once; name -> (model, tokenizer, server)."""
    built = {}
    for name, (config_cls, model_cls, extra, flags) in BUILDS.items():
        root = tmp_path_factory.mktemp(name)
        built[name] = (*_build(root, config_cls, model_cls, extra), ("--model-path", str(root), *flags, *FLAGS))
    with ThreadPoolExecutor(len(built)) as pool:
        futures = {name: pool.submit(ServerProcess, *b[2]) for name, b in built.items()}
    procs = {name: f.result() for name, f in futures.items() if f.exception() is None}
    if len(procs) < len(futures):  # a failed start still stops the others
        for p in procs.values():
            p.stop()
        raise next(f.exception() for f in futures.values() if f.exception() is not None)
    yield {name: (built[name][0], built[name][1], procs[name]) for name in built}
    for p in procs.values():
        p.stop()


def _classify(server, body: dict, route: str = "/classify") -> dict:
    r = httpx.post(server.url + route, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _expect_softmax(model, ids: list[int]) -> list[float]:
    return _logits(model, ids).softmax(-1).tolist()


def _last_row_probs(model, ids: list[int]) -> list[float]:
    """The score head on the last position whatever its token (what pooling literally the last token gives)."""
    import torch

    with torch.no_grad():
        hidden = model.model(torch.tensor([ids])).last_hidden_state[0, -1]
        return model.score(hidden).double().softmax(-1).tolist()


# ------------------------------------------------------------------ three labels: softmax
def test_classify_equals_transformers_softmax(servers):
    model, tok, server = servers["qwen3"]
    ids = [tok(t)["input_ids"] for t in TEXTS]
    ref = [_expect_softmax(model, i) for i in ids]
    assert max(max(p) - min(p) for p in ref) > 0.1  # the head's probabilities are far from uniform
    assert all(0.001 < p < 0.999 for r in ref for p in r)  # and none saturated
    for body_input, expect in ((TEXTS[1], ref[1:2]), (TEXTS, ref), (ids[0], ref[:1]), (ids, ref)):
        out = _classify(server, {"model": "default", "input": body_input, "user": "u"})
        assert [d["index"] for d in out["data"]] == list(range(len(expect)))
        for d, r in zip(out["data"], expect):
            assert d["probs"] == pytest.approx(r, abs=1e-4)
            assert d["num_classes"] == 3 and d["label"] == LABELS[max(range(3), key=r.__getitem__)]
        assert out["object"] == "list" and out["id"].startswith("classify-") and isinstance(out["created"], int)
        n = sum(len(ids[TEXTS.index(t)]) if isinstance(t, str) else len(t)
                for t in ([body_input] if isinstance(body_input, str) or isinstance(body_input[0], int)
                          else body_input))
        assert out["usage"] == {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0,
                                "prompt_tokens_details": None}
    assert {d["label"] for d in _classify(server, {"input": TEXTS})["data"]} <= set(LABELS.values())
    again = _classify(server, {"input": TEXTS}, route="/v1/classify")
    assert [p for d in again["data"] for p in d["probs"]] == pytest.approx([p for r in ref for p in r], abs=1e-4)


def test_truncate_prompt_tokens_keeps_the_last_tokens(servers):
    model, tok, server = servers["qwen3"]
    ids = tok(TEXTS[1])["input_ids"]
    out = _classify(server, {"input": TEXTS[1], "truncate_prompt_tokens": 3})
    assert out["data"][0]["probs"] == pytest.approx(_expect_softmax(model, ids[-3:]), abs=1e-4)
    assert out["usage"]["prompt_tokens"] == 3
    whole = _classify(server, {"input": TEXTS[1], "truncate_prompt_tokens": -1})
    assert whole["data"][0]["probs"] == pytest.approx(_expect_softmax(model, ids), abs=1e-4)


def test_trailing_pad_tokens_are_not_classified(servers):
    """transformers pools the rightmost token that is not pad_token_id: trailing pads are left out, a pad inside
    the prompt is read, a prompt of pads alone pools its first."""
    model, tok, server = servers["qwen3"]
    ids = tok(TEXTS[1])["input_ids"]
    for prompt in (ids + [PAD, PAD], ids[:3] + [PAD] + ids[3:] + [PAD]):
        expect = _expect_softmax(model, prompt)  # transformers' own pooling of the padded prompt
        got = _classify(server, {"input": prompt})["data"][0]["probs"]
        assert got == pytest.approx(expect, abs=1e-4), prompt
        assert max(abs(a - b) for a, b in zip(expect, _last_row_probs(model, prompt))) > 1e-3, prompt
    # pads alone: position 0 (identical tokens give identical states, so only the answer is compared)
    got = _classify(server, {"input": [PAD, PAD, PAD]})
    assert got["data"][0]["probs"] == pytest.approx(_expect_softmax(model, [PAD, PAD, PAD]), abs=1e-4)
    assert got["usage"]["prompt_tokens"] == 1
    assert _classify(server, {"input": ids + [PAD]})["usage"]["prompt_tokens"] == len(ids)


def test_chat_messages_and_raw_logits(servers):
    model, tok, server = servers["qwen3"]
    turns = [{"role": "user", "content": TEXTS[1]}, {"role": "assistant", "content": "Noted."}]
    for fields, kw in (({}, {"add_generation_prompt": False}),
                       ({"add_generation_prompt": True}, {"add_generation_prompt": True}),
                       ({"continue_final_message": True, "add_special_tokens": True},
                        {"continue_final_message": True})):
        ids = tok(tok.apply_chat_template(turns, tokenize=False, **kw), add_special_tokens=False)["input_ids"]
        out = _classify(server, {"messages": turns, **fields, "request_id": "c1"})
        assert out["data"][0]["probs"] == pytest.approx(_expect_softmax(model, ids), abs=1e-4), fields
        assert out["usage"]["prompt_tokens"] == len(ids) and out["id"] == "classify-c1"
    ids = tok(TEXTS[1])["input_ids"]
    raw = _classify(server, {"input": TEXTS[1], "use_activation": False})["data"][0]
    logits = _logits(model, ids).tolist()
    assert raw["probs"] == pytest.approx(logits, abs=1e-4) and abs(sum(logits) - 1.0) > 0.01
    assert raw["label"] == LABELS[max(range(3), key=logits.__getitem__)]
    on = _classify(server, {"input": TEXTS[1], "use_activation": True})["data"][0]
    assert on["probs"] == pytest.approx(_expect_softmax(model, ids), abs=1e-4)
    bare = _classify(server, {"input": TEXTS[1], "add_special_tokens": False})
    assert bare["usage"]["prompt_tokens"] == len(tok(TEXTS[1], add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("body, param", [
    ({}, "input"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["ok", ""]}, "input[1]"),
    ({"input": [[]]}, "input"),
    ({"input": [1, "a"]}, "input"),
    ({"input": [10**9]}, "input"),  # not a token id
    ({"input": list(range(5, 700))}, None),  # longer than the 512-token context
    ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"input": "x", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({"input": "x", "truncate_prompt_tokens": 10**6}, "truncate_prompt_tokens"),
    ({"input": "x", "truncate_prompt_tokens": "3"}, "truncate_prompt_tokens"),
    ({"input": "x", "user": 5}, "user"),
    ({"input": "x", "softmax": False}, "softmax"),  # unknown fields are refused by name
    ({"input": "x", "use_activation": "false"}, "use_activation"),
    ({"input": "x", "messages": [{"role": "user", "content": "x"}]}, "input"),
    ({"input": "x", "continue_final_message": True}, "continue_final_message"),
    ({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": 1}, "add_generation_prompt"),
    ({"input": "x", "add_special_tokens": None, "priority": 3}, "priority"),  # no --enable-priority-scheduling
    ({"input": "x", "dimensions": 2}, "dimensions"),  # an embeddings field
    ("x", "body"),
])
def test_bad_classify_input_is_400(servers, body, param):
    _, _, server = servers["qwen3"]
    r = httpx.post(server.url + "/classify", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_classifier_refuses_other_routes(servers):
    _, _, server = servers["qwen3"]
    for route, body in (("/v1/embeddings", {"input": "x"}), ("/encode", {"text": "x"})):
        r = httpx.post(server.url + route, json=body)
        assert r.status_code == 400 and "/classify" in r.json()["error"]["message"], (route, r.text)
    r = httpx.post(server.url + "/v1/score", json={"text_1": "a", "text_2": ["b"]})
    assert r.status_code == 400 and "num_labels 1" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400 and "pooling model" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 400 and "pooling model" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/classify", json={"model": "another-model", "input": "x"})
    assert r.status_code == 404
    assert httpx.get(server.url + "/get_model_info").json()["is_generation"] is False
    assert_idle_and_whole(httpx.Client(base_url=server.url))


# ------------------------------------------------------------------ one label: sigmoid, cross-encoder scores
def test_one_label_classify_is_sigmoid(servers):
    model, tok, server = servers["llama"]
    out = _classify(server, {"input": TEXTS})
    for d, t in zip(out["data"], TEXTS):
        ref = _logits(model, tok(t)["input_ids"]).sigmoid().tolist()
        assert d["probs"] == pytest.approx(ref, abs=1e-4) and d["num_classes"] == 1 and d["label"] == "LABEL_0"


def test_one_label_scores_pairs_as_a_cross_encoder(servers):
    model, tok, server = servers["llama"]
    query, docs = "what is the capital of France?", ["Paris is the capital of France.", "Bananas are yellow.", "x"]
    ref = [_logits(model, tok(query, text_pair=d)["input_ids"]).sigmoid().item() for d in docs]
    assert max(ref) - min(ref) > 1e-3  # the documents score apart
    score = httpx.post(server.url + "/v1/score", json={"text_1": query, "text_2": docs}).json()
    assert [s["score"] for s in score["data"]] == pytest.approx(ref, abs=1e-4)
    out = httpx.post(server.url + "/v1/rerank", json={"query": query, "documents": docs, "top_n": 2}).json()
    order = sorted(range(len(docs)), key=lambda i: -ref[i])[:2]
    assert [r["index"] for r in out["results"]] == order
    assert [r["relevance_score"] for r in out["results"]] == pytest.approx([ref[i] for i in order], abs=1e-4)
    n = sum(len(tok(query, text_pair=d)["input_ids"]) for d in docs)
    assert out["usage"]["prompt_tokens"] == n
    logits = [_logits(model, tok(query, text_pair=d)["input_ids"]).item() for d in docs]
    raw = httpx.post(server.url + "/v1/score", json={"text_1": query, "text_2": docs, "use_activation": False}).json()
    assert [s["score"] for s in raw["data"]] == pytest.approx(logits, abs=1e-4)
    cut = [_logits(model, tok(query, text_pair=d)["input_ids"][-4:]).sigmoid().item() for d in docs]
    short = httpx.post(server.url + "/v1/rerank", json={"query": query, "documents": docs, "truncate_prompt_tokens": 4,
                                                        "return_documents": False}).json()
    assert {r["index"]: r["relevance_score"] for r in short["results"]} == pytest.approx(dict(enumerate(cut)), abs=1e-4)
    assert short["usage"]["prompt_tokens"] == 4 * len(docs)
    r = httpx.post(server.url + "/v1/score", json={"queries": query, "documents": docs, "instruction": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "instruction"  # no template slot for it
    assert "cross-encoder" in r.json()["error"]["message"]
    assert_idle_and_whole(httpx.Client(base_url=server.url))


# ------------------------------------------------------------------ Gemma 2: its decoder under the score head
def test_gemma2_classifier_equals_transformers(servers):
    """Gemma 2's embedding scale, norms and soft-capped attention under the score head (no logit soft-capping)."""
    model, tok, server = servers["gemma2"]
    ids = [tok(t)["input_ids"] for t in TEXTS]
    ref = [_expect_softmax(model, i) for i in ids]
    assert max(max(p) - min(p) for p in ref) > 0.05
    out = _classify(server, {"input": TEXTS})
    assert [d["probs"] for d in out["data"]] == [pytest.approx(r, abs=1e-4) for r in ref]
    assert [d["label"] for d in out["data"]] == [f"LABEL_{max(range(2), key=r.__getitem__)}" for r in ref]
    padded = _classify(server, {"input": ids[1] + [PAD]})["data"][0]["probs"]
    assert padded == pytest.approx(_expect_softmax(model, ids[1] + [PAD]), abs=1e-4)
    assert_idle_and_whole(httpx.Client(base_url=server.url))


def test_gemma3_text_classifier_equals_transformers(servers):
    """Gemma 3's qk-norm, sliding and global layers with their two ropes, under the score head."""
    model, tok, server = servers["gemma3"]
    ids = [tok(t)["input_ids"] for t in TEXTS]
    assert max(len(i) for i in ids) > 4  # past the sliding layer's window
    ref = [_expect_softmax(model, i) for i in ids]
    assert max(max(p) - min(p) for p in ref) > 0.05
    out = _classify(server, {"input": TEXTS})
    assert [d["probs"] for d in out["data"]] == [pytest.approx(r, abs=1e-4) for r in ref]
    assert_idle_and_whole(httpx.Client(base_url=server.url))


# ------------------------------------------------------------------ multi-label: a sigmoid per label
def test_multi_label_classify_is_sigmoid_per_label(servers):
    model, tok, server = servers["qwen2"]
    out = _classify(server, {"input": TEXTS[:2]})
    for d, t in zip(out["data"], TEXTS[:2]):
        ref = _logits(model, tok(t)["input_ids"]).sigmoid().tolist()
        assert d["probs"] == pytest.approx(ref, abs=1e-4) and d["num_classes"] == 2
        assert d["label"] == f"LABEL_{max(range(2), key=ref.__getitem__)}"
    assert_idle_and_whole(httpx.Client(base_url=server.url))
