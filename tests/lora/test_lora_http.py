"""LoRA adapters over HTTP on a real server (tiny random Llama, two peft adapters): SGLang's `lora_path` on
/generate, OpenAI `model` "<base>:<adapter>" and the bare adapter name through the openai SDK, /v1/models
listing the adapters with their parent, and an unknown adapter refused naming it."""

from __future__ import annotations

import httpx
import openai
import pytest
from lora_adapters import ADAPTERS, PROMPT, SP, build_base_and_adapters
from server_utils import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_http")
    want = build_base_and_adapters(root, (PROMPT,))
    srv = ServerProcess("--model-path", str(root / "base"), "--dtype", "float32", "--max-total-tokens", "2048",
                        "--debug-check-integrity",
                        "--lora-paths", *[f"{n}={root / n}" for n in ADAPTERS])
    try:
        yield srv, want
    finally:
        srv.stop()


def generate(srv, **body):
    return httpx.post(srv.url + "/generate", json={"input_ids": PROMPT, "sampling_params": SP, **body}, timeout=120)


def test_models_lists_adapters_with_parent(server):
    srv, _ = server
    data = httpx.get(srv.url + "/v1/models", timeout=10).json()["data"]
    base = data[0]["id"]
    assert [(m["id"], m.get("parent")) for m in data] == [(base, None), ("alpha", base), ("beta", base)]


def test_native_lora_path_matches_peft(server):
    srv, want = server
    for name in ("alpha", "beta", None):
        r = generate(srv, lora_path=name)
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"] == want[name or ""][tuple(PROMPT)]


def test_openai_model_names_the_adapter(server):
    srv, _ = server
    base = httpx.get(srv.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
    sp = {"max_new_tokens": 12, "temperature": 0}
    texts = {}
    for name, model in (("alpha", f"{base}:alpha"), ("beta", "beta"), (None, base)):
        got = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
        native = httpx.post(srv.url + "/generate", json={"input_ids": PROMPT, "sampling_params": sp,
                                                         "lora_path": name}, timeout=120).json()
        assert got.choices[0].text == native["text"]
        texts[name] = native["text"]
    assert len(set(texts.values())) == 3


def test_unknown_adapter_is_refused_naming_it(server):
    srv, _ = server
    r = generate(srv, lora_path="gamma")
    assert r.status_code == 400 and "'gamma'" in r.text
    base = httpx.get(srv.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
    with pytest.raises(openai.NotFoundError, match="gamma"):
        client.completions.create(model=f"{base}:gamma", prompt=PROMPT, max_tokens=4)


def test_cached_tokens_per_adapter(server):
    srv, _ = server
    long = list(range(900, 940))
    body = {"input_ids": long, "sampling_params": SP}

    def cached(name):
        r = httpx.post(srv.url + "/generate", json={**body, "lora_path": name}, timeout=120)
        return r.json()["meta_info"]["cached_tokens"]

    assert cached("alpha") == 0
    assert cached("alpha") > 0
    assert cached("beta") == 0


def test_load_and_unload_over_http(server, tmp_path_factory):
    srv, want = server
    root = next(p for p in tmp_path_factory.getbasetemp().iterdir() if p.name.startswith("lora_http"))
    r = httpx.post(srv.url + "/load_lora_adapter", json={"lora_name": "gamma", "lora_path": str(root / "alpha")},
                   timeout=60)
    assert r.status_code == 200 and r.json()["loaded_adapters"] == {"alpha": 1, "beta": 2, "gamma": 3}, r.text
    got = generate(srv, lora_path="gamma")
    assert got.json()["output_ids"] == want["alpha"][tuple(PROMPT)]
    assert any(m["id"] == "gamma" for m in httpx.get(srv.url + "/v1/models", timeout=10).json()["data"])
    bad = httpx.post(srv.url + "/load_lora_adapter", json={"lora_name": "x", "lora_path": str(root / "nowhere")},
                     timeout=60)
    assert bad.status_code == 400 and "adapter_config.json" in bad.text
    r = httpx.post(srv.url + "/unload_lora_adapter", json={"lora_name": "gamma"}, timeout=90)
    assert r.status_code == 200 and r.json()["loaded_adapters"] == {"alpha": 1, "beta": 2}
    refused = generate(srv, lora_path="gamma")
    assert refused.status_code == 400 and "'gamma'" in refused.text
    r = httpx.post(srv.url + "/unload_lora_adapter", json={"lora_name": "gamma"}, timeout=10)
    assert r.status_code == 400 and "'gamma'" in r.text


def test_one_batch_of_the_base_and_both_adapters(server):
    """The same prompt under the base and each adapter in one /generate call (a list of lora_path): each output
    equals transformers + peft (merged), and the three differ."""
    srv, want = server
    names = [None, "alpha", "beta"]
    r = httpx.post(srv.url + "/generate", json={"input_ids": [PROMPT] * 3, "sampling_params": SP,
                                                "lora_path": names}, timeout=120)
    assert r.status_code == 200, r.text
    outs = [o["output_ids"] for o in r.json()]
    assert outs == [want[n or ""][tuple(PROMPT)] for n in names]
    assert len({tuple(o) for o in outs}) == 3


def test_sglang_lora_path_on_the_openai_routes(server):
    """SGLang's `lora_path` in an OpenAI body runs that adapter, as `model` naming it does; a `model` naming
    another adapter, or an unknown adapter, is a 400 naming lora_path."""
    srv, want = server
    base = httpx.get(srv.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
    for name in ("alpha", "beta"):
        by_path = client.completions.create(model=base, prompt=PROMPT, max_tokens=12, temperature=0,
                                            extra_body={"lora_path": name}).choices[0].text
        by_model = client.completions.create(model=f"{base}:{name}", prompt=PROMPT, max_tokens=12,
                                             temperature=0).choices[0].text
        assert by_path == by_model
    same = client.completions.create(model="alpha", prompt=PROMPT, max_tokens=4, temperature=0,
                                     extra_body={"lora_path": "alpha"})
    assert same.choices[0].text
    for model, path, named in (("beta", "alpha", "different adapters"), (base, "gamma", "'gamma'"),
                               (base, 3, "lora_path")):
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
            "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "lora_path": path})
        assert r.status_code == 400 and named in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"] == "lora_path"
