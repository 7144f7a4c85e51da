"""The model's sampling defaults (--sampling-defaults model, SGLang's default): generation_config.json's fields read
(protocol/sampling_defaults.py: do_sample false is greedy, top_k 0 is off, a value the runtime refuses fails the
start naming the file), --override-generation-config merged over them (unknown keys and bad values refused naming
the flag), then a real server on a tiny random Llama whose generation_config.json says top_k 1 and max_new_tokens
7: the OpenAI and Anthropic routes sample greedily where a request leaves the fields unset (the same text under any
seed, equal to temperature 0), a request's own top_k wins, native /generate keeps its own defaults, a request
without max_tokens stops at max_new_tokens (chat, completions, Responses) while one with max_tokens runs to it;
a second server on the same directory with the override's max_new_tokens stops there instead, and lowers a
request's larger max tokens to it on those routes too (vLLM's get_max_tokens), while /generate runs as sent."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from radixlang_runtime.protocol.sampling_defaults import max_tokens_cap, parse_override, sampling_defaults
from radixlang_runtime.server.openai_records import OpenAIOptions
from radixlang_runtime.server_args import ServerArgs
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
                                    "repetition_penalty": 1.1, "max_new_tokens": 99}
    assert sampling_defaults(d, "openai") == {}
    d = write(tmp_path / "b", {"do_sample": False, "temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.2,
                               "max_new_tokens": 32})
    assert sampling_defaults(d) == {"temperature": 0.0, "repetition_penalty": 1.2, "max_new_tokens": 32}  # greedy
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
    for bad in (0, -1, 1.5, True, "8"):
        with pytest.raises(ValueError, match=r"generation_config\.json: max_new_tokens must be an integer >= 1"):
            sampling_defaults(write(tmp_path / "f", {"max_new_tokens": bad}))


def test_override_merges_over_the_file(tmp_path):
    d = write(tmp_path / "a", {"temperature": 0.6, "top_k": 20, "max_new_tokens": 99})
    assert sampling_defaults(d, override='{"temperature": 0.5, "max_new_tokens": 64}') == \
        {"temperature": 0.5, "top_k": 20, "max_new_tokens": 64}
    assert sampling_defaults(d, override={"top_k": None, "min_p": 0.1}) == \
        {"temperature": 0.6, "min_p": 0.1, "max_new_tokens": 99}  # null drops the file's value
    assert sampling_defaults(d, override='{"top_k": 0}')["top_k"] == -1
    assert sampling_defaults(d, "openai", '{"max_new_tokens": 8}') == {"max_new_tokens": 8}  # the flag still applies
    assert sampling_defaults(str(tmp_path), override='{"temperature": 0}') == {"temperature": 0}  # no file
    greedy = write(tmp_path / "b", {"do_sample": False, "top_p": 0.9})
    assert sampling_defaults(greedy, override='{"temperature": 0.7}') == {"temperature": 0.7}
    assert parse_override(None) == {} and parse_override("{}") == {}


def test_only_the_override_caps_a_requests_own_max_tokens():
    """vLLM's get_max_tokens: min(the request's count or the default, the room, the override's max_new_tokens)."""
    assert max_tokens_cap(None) is None and max_tokens_cap('{"temperature": 0.5}') is None
    assert max_tokens_cap('{"max_new_tokens": 8}') == 8 and max_tokens_cap('{"max_new_tokens": null}') is None

    def max_new(asked, model_default, cap, route_default=16, room=50) -> int:
        opts = OpenAIOptions(1, False, False, 0, None, {}, asked, model_max_tokens=model_default, max_tokens_cap=cap)
        return opts.sampling_params(route_default, room)["max_new_tokens"]

    assert max_new(20, 99, None) == 20  # the file's value is a default only: a request's own count stands
    assert max_new(None, 99, None) == 50  # ... within the room
    assert max_new(None, None, None) == 16  # no model default: the route's
    assert max_new(20, 8, 8) == 8  # the override's lowers a larger count
    assert max_new(3, 8, 8) == 3  # and leaves a smaller one
    assert max_new(None, None, 8) == 8 and max_new(None, None, 8, route_default=4) == 4
    assert max_new(None, 8, 8, room=5) == 5


@pytest.mark.parametrize("raw,needle", [
    ("{not json", r"--override-generation-config must be a JSON object: "),
    ("[1]", r"--override-generation-config must be a JSON object such as"),
    ('{"max_tokens": 8, "do_sample": false}', r"--override-generation-config: unknown key\(s\) 'do_sample', "
                                              r"'max_tokens' \(known: temperature, .*max_new_tokens\)"),
    ('{"max_new_tokens": 0}', r"--override-generation-config: max_new_tokens must be an integer >= 1, got 0"),
    ('{"max_new_tokens": "64"}', r"--override-generation-config: max_new_tokens must be an integer >= 1"),
    ('{"temperature": -1}', r"--override-generation-config: .*temperature"),
    ('{"top_p": 2}', r"--override-generation-config: .*top_p"),
    ('{"repetition_penalty": 5.0}', r"--override-generation-config: .*repetition_penalty"),
])
def test_override_refused_at_start(raw, needle):
    with pytest.raises(ValueError, match=needle):
        parse_override(raw)
    with pytest.raises(ValueError, match=needle):
        ServerArgs(override_generation_config=raw)
    assert ServerArgs(override_generation_config='{"max_new_tokens": 64}').override_generation_config


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_sampling_defaults")
    build_tiny(path, "LlamaConfig", TINY, {})
    cfg = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**cfg, "do_sample": True, "top_k": 1,
                                                             "temperature": 1.3, "max_new_tokens": 7}))
    srv = ServerProcess("--model-path", str(path), "--dtype", "float32", "--max-total-tokens", "4096")
    srv.model_path = str(path)
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


def _chat(c: httpx.Client, **kw) -> dict:
    r = c.post("/v1/chat/completions", json={"messages": HI, "ignore_eos": True, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_unset_max_tokens_takes_max_new_tokens(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        out = _chat(c)
        assert (out["choices"][0]["finish_reason"], out["usage"]["completion_tokens"]) == ("length", 7)
        for field in ("max_tokens", "max_completion_tokens"):  # a request's own count is unaffected, either way
            out = _chat(c, **{field: 10})
            assert (out["choices"][0]["finish_reason"], out["usage"]["completion_tokens"]) == ("length", 10)
        r = c.post("/v1/completions", json={"prompt": "Once", "ignore_eos": True})  # not the API's 16
        assert r.status_code == 200, r.text
        assert (r.json()["choices"][0]["finish_reason"], r.json()["usage"]["completion_tokens"]) == ("length", 7)
        assert _chat(c, ignore_eos=False)["usage"]["completion_tokens"] == 7  # greedy: no end of turn before
        r = c.post("/v1/responses", json={"input": HI})  # no max_output_tokens: the same greedy run, cut alike
        assert r.status_code == 200, r.text
        assert (r.json()["status"], r.json()["usage"]["output_tokens"]) == ("incomplete", 7)
        assert_idle_and_whole(c)


@pytest.fixture(scope="module")
def overridden(server):
    srv = ServerProcess("--model-path", server.model_path, "--dtype", "float32", "--max-total-tokens", "4096",
                        "--override-generation-config", '{"max_new_tokens": 5}')
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


def test_override_wins_over_the_file(server, overridden):
    with httpx.Client(base_url=overridden.url, timeout=120) as c:
        out = _chat(c)
        assert (out["choices"][0]["finish_reason"], out["usage"]["completion_tokens"]) == ("length", 5)
        for field in ("max_tokens", "max_completion_tokens"):  # a larger count of the request's own is lowered
            capped = _chat(c, **{field: 9})
            assert (capped["choices"][0]["finish_reason"], capped["usage"]["completion_tokens"]) == ("length", 5)
        assert _chat(c, max_tokens=3)["usage"]["completion_tokens"] == 3  # a smaller one stands
        r = c.post("/v1/completions", json={"prompt": "Once", "ignore_eos": True, "max_tokens": 12})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 5
        r = c.post("/v1/responses", json={"input": HI, "max_output_tokens": 12})
        assert r.status_code == 200, r.text
        assert (r.json()["status"], r.json()["usage"]["output_tokens"]) == ("incomplete", 5)
        assert r.json()["max_output_tokens"] == 5  # the count it ran with, as vLLM repeats it
        native = c.post("/generate", json={"text": "Once", "sampling_params": {"max_new_tokens": 9,
                                                                                "ignore_eos": True}})
        assert native.json()["meta_info"]["completion_tokens"] == 9  # /generate takes its sampling params as sent
        assert_idle_and_whole(c)
    with httpx.Client(base_url=server.url, timeout=120) as c:  # the file's top_k 1 still applies: greedy alike
        same = _chat(c, max_tokens=5)["choices"][0]["message"]["content"]
    assert out["choices"][0]["message"]["content"] == same
