"""The model's sampling defaults (--sampling-defaults model, SGLang's default): generation_config.json's fields read
(protocol/sampling_defaults.py: do_sample false is greedy, top_k 0 is off, a value the runtime refuses fails the
start naming the file), then a real server on a tiny random Llama whose generation_config.json says top_k 1: the
OpenAI and Anthropic routes sample greedily where a request leaves the fields unset (the same text under any
seed, equal to temperature 0), a request's own top_k wins, and native /generate keeps its own defaults."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from radixlang_runtime.protocol.sampling_defaults import sampling_defaults
from server_utils import ServerProcess, assert_idle_and_whole
from tiny_checkpoints import build_tiny

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=2048)
HI = [{"role": "user", "content": "Tell me a story"}]


def write(path, cfg: dict):
    path.mkdir(exist_ok=True)
    (path / "generation_config.json").write_text(json.dumps(cfg))
    return str(path)


def test_generation_config_fields(tmp_path):
    assert sampling_defaults(str(tmp_path)) == {}  # no file
    d = write(tmp_path / "a", {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05,
                                "repetition_penalty": 1.1, "max_new_tokens": 99, "bos_token_id": 1})
    assert sampling_defaults(d) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05,
                                    "repetition_penalty": 1.1}
    assert sampling_defaults(d, "openai") == {}
    d = write(tmp_path / "b", {"do_sample": False, "temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.2})
    assert sampling_defaults(d) == {"temperature": 0.0, "repetition_penalty": 1.2}  # greedy
    d = write(tmp_path / "c", {"top_k": 0, "temperature": 0.7})  # do_sample unset: not greedy
    assert sampling_defaults(d) == {"top_k": -1, "temperature": 0.7}
    d = write(tmp_path / "d", {"repetition_penalty": 5.0})
    with pytest.raises(ValueError, match=r"generation_config\.json.*repetition_penalty.*--sampling-defaults openai"):
        sampling_defaults(d)
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "generation_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot be read"):
        sampling_defaults(str(tmp_path / "e"))
    with pytest.raises(ValueError, match="sampling_defaults must be one of"):
        sampling_defaults(d, "vllm")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_sampling_defaults")
    build_tiny(path, "LlamaConfig", TINY, {})
    cfg = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**cfg, "do_sample": True, "top_k": 1,
                                                             "temperature": 1.3}))
    srv = ServerProcess("--model-path", str(path), "--dtype", "float32", "--max-total-tokens", "4096")
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


def test_unset_fields_take_the_models_defaults(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        def chat(**kw) -> str:
            r = c.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 16, **kw})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]["content"]

        greedy = chat(temperature=0)
        assert {chat(seed=s) for s in range(4)} == {greedy}  # top_k 1 from generation_config.json
        own = {chat(seed=s, top_k=-1) for s in range(4)}  # the request's top_k wins: temperature 1.3 samples
        assert len(own) > 1
        completion = c.post("/v1/completions", json={"prompt": "Once", "max_tokens": 12, "seed": 1}).json()
        assert completion["choices"][0]["text"] == c.post("/v1/completions", json={
            "prompt": "Once", "max_tokens": 12, "temperature": 0}).json()["choices"][0]["text"]
        native = {c.post("/generate", json={"text": "Once", "sampling_params": {
            "max_new_tokens": 12, "sampling_seed": s}}).json()["text"] for s in range(4)}
        assert len(native) > 1  # /generate takes its sampling params as sent (temperature 1, whole vocabulary)
        msg = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0).messages.create(
            model="default", max_tokens=16, messages=HI)
        assert msg.content[0].text == greedy
        assert_idle_and_whole(c)
