"""Pooling models end to end: real `launch_server` processes on tiny random checkpoints the test builds, the openai
SDK and sentence-transformers as the reference (float32).

- a tiny Llama saved by sentence-transformers (Transformer with its chat template's message modality -> last-token
  Pooling -> Normalize), served with --is-embedding: /v1/embeddings (SDK, strings, batches, token arrays, base64) and
  /encode equal sentence-transformers' encode; bad input answers 400 in OpenAI's shape; one call is one prefill batch;
- a tiny Qwen3 (bare Qwen3Model checkpoint, no chat template, mean Pooling -> Normalize, Matryoshka) with chunked
  prefill: mean over the chunks, `dimensions`, cosine rerank / score;
/classify on the embedding server answers 400 naming a sequence classifier (a decoder reranker: test_reranker.py).
vLLM's pooling fields: chat `messages` equal the template's tokens embedded, truncate_prompt_tokens keeps the last
tokens (or the first), use_activation false is the pooled vector before Normalize, request_id names the answer,
cache_salt keeps a prompt out of the shared cache, base64 in every embed_dtype and byte order; each bad value
answers 400 naming its field.
After each server's scenarios its KV pool is whole.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import warnings
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from server_utils import ServerProcess
from server_utils import assert_idle_and_whole
from tiny_checkpoints import build_tiny

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=512)
FLAGS = ("--dtype", "float32", "--max-total-tokens", "4096", "--debug-check-integrity")
TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "a", "Embeddings power retrieval."]


def _sentence_transformer(base: str, out: str, mode: str, chat_template: bool):
    """The checkpoint at `base` as Transformer -> Pooling(mode) -> Normalize, saved to `out`; returns the model."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from sentence_transformers import SentenceTransformer, models

    if not chat_template:  # sentence-transformers >= 6 renders text through a tokenizer's chat template
        os.remove(os.path.join(base, "chat_template.jinja"))
    t = models.Transformer(base)
    dim = getattr(t, "get_embedding_dimension", None) or t.get_word_embedding_dimension  # renamed in 6
    st = SentenceTransformer(modules=[t, models.Pooling(dim(), pooling_mode=mode), models.Normalize()], device="cpu")
    st.save(out)
    return st


def _cos(a, b) -> float:
    import torch

    return torch.nn.functional.cosine_similarity(torch.as_tensor(a, dtype=torch.float64),
                                                 torch.as_tensor(b).to(torch.float64), dim=0).item()


def _build_last(root):
    build_tiny(root / "base", "LlamaConfig", {**TINY, "tie_word_embeddings": True}, {})
    st = _sentence_transformer(str(root / "base"), str(root / "st"), "lasttoken", chat_template=True)
    return st, ("--model-path", str(root / "st"), "--is-embedding", *FLAGS)


def _build_mean(root):
    build_tiny(root / "base", "Qwen3Config", TINY, {})  # untied: the saved Qwen3Model has no lm_head
    st = _sentence_transformer(str(root / "base"), str(root / "st"), "mean", chat_template=False)
    cfg_path = root / "st" / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "is_matryoshka": True}))
    return st, ("--model-path", str(root / "st"), "--is-embedding", "--chunked-prefill-size", "32", *FLAGS)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The two servers, started at once (a start is mostly one process's own work)."""
    built = {name: fn(tmp_path_factory.mktemp(name)) for name, fn in (("last", _build_last), ("mean", _build_mean))}
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(ServerProcess, *flags) for name, (_, flags) in built.items()}
    procs = {name: f.result() for name, f in futures.items() if f.exception() is None}
    if len(procs) < len(futures):  # a failed start still stops the others
        for p in procs.values():
            p.stop()
        raise next(f.exception() for f in futures.values() if f.exception() is not None)
    yield {**{name: (built[name][0], procs[name]) for name in built}, "last_dir": built["last"][1][1]}
    for p in procs.values():
        p.stop()


@pytest.fixture(scope="module")
def last_model(servers):
    return servers["last"]


@pytest.fixture(scope="module")
def mean_model(servers):
    return servers["mean"]


def _sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _stats(server) -> dict:
    return httpx.get(server.url + "/server_info").json()["stats"]


# ------------------------------------------------------------------ last-token, chat-template pipeline
def test_sdk_embeddings_equal_sentence_transformers(last_model):
    st, server = last_model
    ref = st.encode(TEXTS, convert_to_tensor=True)
    got = _sdk(server).embeddings.create(model="default", input=TEXTS)  # the SDK asks for base64 and decodes it
    assert [d.index for d in got.data] == list(range(len(TEXTS)))
    for d, r in zip(got.data, ref):
        assert len(d.embedding) == 64 and _cos(d.embedding, r) >= 0.9999
    one = _sdk(server).embeddings.create(model="default", input=TEXTS[1], encoding_format="float")
    assert _cos(one.data[0].embedding, ref[1]) >= 0.9999
    ids = st.tokenize([TEXTS[1]])["input_ids"][0].tolist()
    assert got.usage.prompt_tokens == sum(len(st.tokenize([t])["input_ids"][0]) for t in TEXTS)
    assert one.usage.prompt_tokens == len(ids)


def test_token_arrays_and_base64(last_model):
    st, server = last_model
    ids = [st.tokenize([t])["input_ids"][0].tolist() for t in TEXTS[:2]]
    ref = st.encode(TEXTS[:2], convert_to_tensor=True)
    for body_input, expect in ((ids[0], ref[:1]), (ids, ref)):
        out = httpx.post(server.url + "/v1/embeddings", json={"input": body_input, "encoding_format": "float"}).json()
        assert [_cos(d["embedding"], r) >= 0.9999 for d, r in zip(out["data"], expect)] == [True] * len(expect)
        assert out["object"] == "list" and out["usage"]["prompt_tokens"] == sum(map(len, ids[:len(expect)]))
    b64 = httpx.post(server.url + "/v1/embeddings", json={"input": ids, "encoding_format": "base64"}).json()
    floats = httpx.post(server.url + "/v1/embeddings", json={"input": ids}).json()
    for b, f in zip(b64["data"], floats["data"]):
        raw = base64.b64decode(b["embedding"])
        assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(f["embedding"], abs=1e-7)


def test_encode_native_and_prefix_cache(last_model):
    st, server = last_model
    ref = st.encode(TEXTS[3], convert_to_tensor=True)
    first = httpx.post(server.url + "/encode", json={"text": TEXTS[3]}).json()
    again = httpx.post(server.url + "/encode", json={"text": TEXTS[3]}).json()  # last-token: the prefix is cached
    assert _cos(first["embedding"], ref) >= 0.9999 and _cos(again["embedding"], ref) >= 0.9999
    assert again["meta_info"]["cached_tokens"] > 0 and again["meta_info"]["prompt_tokens"] > 0
    many = httpx.post(server.url + "/encode", json={"text": TEXTS[:2]}).json()
    assert isinstance(many, list) and len(many) == 2
    assert _cos(many[1]["embedding"], st.encode(TEXTS[1], convert_to_tensor=True)) >= 0.9999


def test_one_call_is_one_prefill_batch(last_model):
    _, server = last_model
    assert_idle_and_whole(httpx.Client(base_url=server.url))
    before = _stats(server)["forward_steps"]
    # token arrays with no shared page: inputs sharing a page-long uncached prefix (the chat template's system
    # prompt) would wait one step for the first to cache it (admission's in-batch prefix sharing)
    ids = [[100 + i, 200 + i, 300 + i, 400 + i] for i in range(8)]
    out = httpx.post(server.url + "/v1/embeddings", json={"input": ids}).json()
    assert len(out["data"]) == 8
    assert _stats(server)["forward_steps"] - before == 1


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["ok", ""]}, "input[1]"),
    ({"input": [[]]}, "input"),
    ({"input": list(range(5, 700))}, None),  # longer than the 512-token context
    ({"input": [10**9]}, "input"),  # not a token id
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "dimensions": 16}, "dimensions"),  # not a Matryoshka model
    ({"input": "x", "truncate": True}, "truncate"),
    ({"input": [1, "a"]}, "input"),
    ({}, "input"),
    ({"input": "x", "messages": [{"role": "user", "content": "x"}]}, "input"),
    ({"input": "x", "add_generation_prompt": True}, "add_generation_prompt"),  # a chat field without messages
    ({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": True,
      "continue_final_message": True}, "continue_final_message"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"tokenize": True}},
     "chat_template_kwargs"),
    ({"messages": [{"role": "user", "content": "x"}], "add_special_tokens": "yes"}, "add_special_tokens"),
    ({"input": "x", "add_special_tokens": False}, "add_special_tokens"),  # the message-modality model
    ({"input": "x", "normalize": False}, "normalize"),  # removed in vLLM: use_activation
    ({"input": "x", "use_activation": "no"}, "use_activation"),
    ({"input": "x", "priority": 1}, "priority"),  # no --enable-priority-scheduling
    ({"input": "x", "request_id": 5}, "request_id"),
    ({"input": "x", "request_id": ""}, "request_id"),
    ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"input": "x", "truncate_prompt_tokens": 10**6}, "truncate_prompt_tokens"),
    ({"input": "x", "embed_dtype": "float8"}, "embed_dtype"),
    ({"input": "x", "endianness": "middle"}, "endianness"),
    ({"input": "x", "chat_template": "{{ x }}"}, "chat_template"),
])
def test_bad_embedding_input_is_400(last_model, body, param):
    _, server = last_model
    r = httpx.post(server.url + "/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_chat_messages_are_rendered_through_the_template(last_model):
    st, server = last_model
    tok = st.tokenizer

    def ids_of(messages, **kw) -> list[int]:
        return tok(tok.apply_chat_template(messages, tokenize=False, **kw), add_special_tokens=False)["input_ids"]

    def embed(body) -> dict:
        r = httpx.post(server.url + "/v1/embeddings", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    one = [{"role": "user", "content": TEXTS[1]}]  # the message modality renders a text input the same way
    got = embed({"messages": one, "request_id": "mine"})
    assert _cos(got["data"][0]["embedding"], st.encode(TEXTS[1], convert_to_tensor=True)) >= 0.9999
    assert got["id"] == "embd-mine" and got["usage"]["prompt_tokens"] == len(ids_of(one, add_generation_prompt=False))
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TEXTS[0]},
             {"role": "assistant", "content": "Hi there"}]
    for fields, kw in (({}, {"add_generation_prompt": False}),
                       ({"add_generation_prompt": True}, {"add_generation_prompt": True}),
                       ({"continue_final_message": True}, {"continue_final_message": True})):
        ids = ids_of(turns, **kw)
        chat = embed({"messages": turns, **fields, "chat_template_kwargs": {"unused_variable": 1}})
        ref = embed({"input": ids})
        assert chat["usage"]["prompt_tokens"] == len(ids), fields
        assert _cos(chat["data"][0]["embedding"], ref["data"][0]["embedding"]) >= 0.9999, fields


def test_truncate_prompt_tokens_and_request_id(last_model):
    st, server = last_model
    ids = st.tokenize([TEXTS[1]])["input_ids"][0].tolist()
    out = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[1], "truncate_prompt_tokens": 3,
                                                          "user": "u", "request_id": "abc"}).json()
    tail = httpx.post(server.url + "/v1/embeddings", json={"input": ids[-3:]}).json()
    assert out["usage"]["prompt_tokens"] == 3 and out["id"] == "embd-abc" and isinstance(out["created"], int)
    assert _cos(out["data"][0]["embedding"], tail["data"][0]["embedding"]) >= 0.9999
    whole = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[1], "truncate_prompt_tokens": -1}).json()
    assert whole["usage"]["prompt_tokens"] == len(ids)
    right = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[1], "truncate_prompt_tokens": 3,
                                                            "truncation_side": "right"}).json()
    head = httpx.post(server.url + "/v1/embeddings", json={"input": ids[:3]}).json()
    assert right["usage"]["prompt_tokens"] == 3
    assert _cos(right["data"][0]["embedding"], head["data"][0]["embedding"]) >= 0.9999
    assert _cos(right["data"][0]["embedding"], tail["data"][0]["embedding"]) < 0.999  # not the last three
    side_only = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[1], "truncation_side": "right"}).json()
    assert side_only["usage"]["prompt_tokens"] == len(ids)  # without truncate_prompt_tokens nothing is cut


def test_a_salted_embedding_stays_out_of_the_shared_cache(last_model):
    """cache_salt on a pooling route: a salted prompt's cached prefix is not found without the salt (/encode's
    meta_info shows the cached tokens of the shared namespace; an unrelated text of the same shape shows what the
    shared cache already holds of it: the default prompt and the text's first words)."""
    import uuid

    _, server = last_model

    def text() -> str:
        return f"Salted {uuid.uuid4().hex}: the embedding of a prompt that only its own tenant may reuse."

    def cached(body: dict) -> int:
        return httpx.post(server.url + "/encode", json=body).json()["meta_info"]["cached_tokens"]

    shared = text()
    cached({"text": shared})
    baseline = cached({"text": text()})  # the part every such text shares, cached by the first
    mine = text()
    salted = httpx.post(server.url + "/v1/embeddings", json={"input": mine, "cache_salt": uuid.uuid4().hex})
    assert salted.status_code == 200, salted.text
    assert cached({"text": mine}) == baseline  # the salted run left nothing of its own in the shared cache
    assert cached({"text": mine}) > baseline  # while an unsalted run does


def test_base64_float16_big_endian(last_model):
    _, server = last_model
    floats = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[0]}).json()["data"][0]["embedding"]
    out = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "base64",
                                                          "embed_dtype": "float16", "endianness": "big"}).json()
    raw = base64.b64decode(out["data"][0]["embedding"])
    assert len(raw) == 2 * len(floats)
    assert list(struct.unpack(f">{len(floats)}e", raw)) == pytest.approx(floats, abs=1e-3)
    import torch

    ref = torch.tensor(floats, dtype=torch.float32)
    for dtype, torch_dtype, order in (("bfloat16", torch.bfloat16, "little"), ("bfloat16", torch.bfloat16, "big"),
                                      ("fp8_e4m3", torch.float8_e4m3fn, "native"),
                                      ("fp8_e5m2", torch.float8_e5m2, "native")):
        out = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "base64",
                                                              "embed_dtype": dtype, "endianness": order}).json()
        raw = base64.b64decode(out["data"][0]["embedding"])
        want = ref.to(torch_dtype).view(torch.int16 if torch_dtype is torch.bfloat16 else torch.uint8).numpy()
        want = want.astype(">i2" if order == "big" else "<i2") if torch_dtype is torch.bfloat16 else want
        assert raw == want.tobytes(), (dtype, order)  # torch's cast, bit for bit


def test_sdk_error_and_generation_refused(last_model):
    _, server = last_model
    with pytest.raises(openai.BadRequestError) as e:
        _sdk(server).embeddings.create(model="default", input="x", dimensions=8)
    assert "Matryoshka" in e.value.message
    with pytest.raises(openai.NotFoundError):
        _sdk(server).embeddings.create(model="another-model", input="x")
    r = httpx.post(server.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400 and "--is-embedding" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/classify", json={"input": "x"})
    assert r.status_code == 400 and "sequence classifier" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/get_model_info").json()["is_generation"] is False
    assert httpx.get(server.url + "/health_generate", timeout=60).status_code == 200  # a pooling request there
    assert_idle_and_whole(httpx.Client(base_url=server.url))


def test_engine_encode_in_process(servers):
    from radixlang_runtime.entrypoints.engine import Engine

    st, _ = servers["last"]
    ref = st.encode(TEXTS[:2], convert_to_tensor=True)
    with Engine(model_path=servers["last_dir"], is_embedding=True, dtype="float32", max_total_tokens=1024,
                debug_check_integrity=True) as eng:
        many = eng.encode(TEXTS[:2])
        assert [_cos(m["embedding"], r) >= 0.9999 for m, r in zip(many, ref)] == [True, True]
        one = eng.encode(input_ids=st.tokenize([TEXTS[0]])["input_ids"][0].tolist())
        assert _cos(one["embedding"], ref[0]) >= 0.9999 and one["meta_info"]["prompt_tokens"] > 0
        with pytest.raises(ValueError, match="--is-embedding"):
            eng.generate("hi", {"max_new_tokens": 2})
        eng.check_integrity()


# ------------------------------------------------------------------ mean pooling over chunks, Matryoshka
def test_mean_pooling_over_chunks_equals_sentence_transformers(mean_model):
    st, server = mean_model
    long_text = " ".join(f"word{i}" for i in range(60))  # > 32 tokens: several prefill chunks
    texts = [long_text, *TEXTS]
    assert len(st.tokenize([long_text])["input_ids"][0]) > 64
    ref = st.encode(texts, convert_to_tensor=True)
    for _ in range(2):  # the second time the prompt is cached: mean still computes every position
        got = _sdk(server).embeddings.create(model="default", input=texts)
        assert [_cos(d.embedding, r) >= 0.9999 for d, r in zip(got.data, ref)] == [True] * len(texts)


def test_matryoshka_dimensions(mean_model):
    import torch

    st, server = mean_model
    ref = torch.nn.functional.normalize(st.encode(TEXTS[1], convert_to_tensor=True)[:16], dim=0)
    out = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[1], "dimensions": 16}).json()
    vec = out["data"][0]["embedding"]
    assert len(vec) == 16 and _cos(vec, ref) >= 0.9999 and sum(x * x for x in vec) == pytest.approx(1.0)
    r = httpx.post(server.url + "/v1/embeddings", json={"input": "x", "dimensions": 65})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"


def _raw_mean(st, ids: list[int]):
    """The mean of the final hidden states, before sentence-transformers' Normalize."""
    import torch

    with torch.no_grad():
        return st[0].auto_model(input_ids=torch.tensor([ids])).last_hidden_state[0].double().mean(0)


def test_use_activation_false_is_the_pooled_vector(mean_model):
    st, server = mean_model
    ids = st.tokenize([TEXTS[1]])["input_ids"][0].tolist()
    raw = _raw_mean(st, ids)
    assert abs(raw.norm().item() - 1.0) > 0.01  # normalization would change it
    out = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[1], "use_activation": False}).json()
    assert out["data"][0]["embedding"] == pytest.approx(raw.tolist(), abs=1e-4)
    cut = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[1], "use_activation": False,
                                                          "dimensions": 16}).json()
    assert cut["data"][0]["embedding"] == pytest.approx(raw[:16].tolist(), abs=1e-4)
    on = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[1], "use_activation": True}).json()
    assert on["data"][0]["embedding"] == pytest.approx((raw / raw.norm()).tolist(), abs=1e-4)
    bare = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[1], "add_special_tokens": False,
                                                           "use_activation": False}).json()
    plain = st.tokenizer(TEXTS[1], add_special_tokens=False)["input_ids"]
    assert bare["usage"]["prompt_tokens"] == len(plain)
    assert bare["data"][0]["embedding"] == pytest.approx(_raw_mean(st, plain).tolist(), abs=1e-4)


def test_cosine_scores_truncate_each_text(mean_model):
    import torch

    st, server = mean_model
    docs = [TEXTS[1], TEXTS[3]]
    tail = [_raw_mean(st, st.tokenize([t])["input_ids"][0].tolist()[-2:]) for t in (TEXTS[0], *docs)]
    cos = [torch.nn.functional.cosine_similarity(tail[0], d, dim=0).item() for d in tail[1:]]
    out = httpx.post(server.url + "/v1/score", json={"text_1": TEXTS[0], "text_2": docs, "truncate_prompt_tokens": 2,
                                                     "use_activation": False, "request_id": "s1"}).json()
    assert [s["score"] for s in out["data"]] == pytest.approx(cos, abs=1e-4)
    assert out["id"] == "score-s1" and out["usage"]["prompt_tokens"] == 6


def test_embedding_server_scores_by_cosine(mean_model):
    st, server = mean_model
    docs = TEXTS[1:]
    q, d = st.encode([TEXTS[0]], convert_to_tensor=True)[0], st.encode(docs, convert_to_tensor=True)
    cos = [_cos(q, x) for x in d]
    out = httpx.post(server.url + "/v1/rerank", json={"query": TEXTS[0], "documents": docs, "top_n": 2}).json()
    best = sorted(range(len(docs)), key=lambda i: -cos[i])[:2]
    assert [r["index"] for r in out["results"]] == best
    assert [r["relevance_score"] for r in out["results"]] == pytest.approx([cos[i] for i in best], abs=1e-4)
    score = httpx.post(server.url + "/v1/score", json={"text_1": TEXTS[0], "text_2": docs}).json()
    assert [s["score"] for s in score["data"]] == pytest.approx(cos, abs=1e-4)
    r = httpx.post(server.url + "/v1/rerank", json={"query": TEXTS[0], "documents": docs, "instruction": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "instruction"  # cosine scores have no slot for it
    assert "embeddings" in r.json()["error"]["message"]
    assert_idle_and_whole(httpx.Client(base_url=server.url))
