"""cache_salt on a real server (the embedded model, float32, the overlap schedule, chunked prefill): a prompt sent
twice under one salt is served from the prefix cache the second time; under another salt (SGLang's `extra_key`
on /generate) or none it is computed again; the outputs are the same whichever way; a /generate batch takes one
salt per prompt (a list), so two equal prompts of one body share the cache only under equal salts; native, chat,
completions and Responses take the field, and a bad one (a list's wrong length or element, a list on the OpenAI
routes) is a 400 naming it. The allocator is whole after."""

from __future__ import annotations

import uuid

import httpx
import pytest

from server_utils import HIDDEN_FLAGS, assert_idle_and_whole, shared_server

STORY = ("The old lighthouse keeper climbed the spiral stairs every evening, counting each step aloud, and "
         "watched the ships pass the rocky point until the lamp burned bright against the dark sea.")
GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def client():
    srv = shared_server(*HIDDEN_FLAGS)
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c
        assert_idle_and_whole(c)


def fresh_prompt() -> str:
    """A prompt no other request of the test run sent (its first tokens differ), long enough for whole pages."""
    return f"Note {uuid.uuid4().hex}. {STORY}"


def fresh_salts(n: int) -> list[str]:
    """Salts no other request of the test run used (a chat template's shared head is cached per salt too)."""
    return [uuid.uuid4().hex for _ in range(n)]


def generate(client, text: str, **fields) -> dict:
    r = client.post("/generate", json={"text": text, "sampling_params": GREEDY, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def test_generate_reuses_the_cache_only_within_a_salt(client):
    text, (a, b) = fresh_prompt(), fresh_salts(2)
    first = generate(client, text, cache_salt=a)
    again = generate(client, text, cache_salt=a)
    other = generate(client, text, extra_key=b)  # SGLang's name
    plain = generate(client, text)
    plain_again = generate(client, text)
    prompt_tokens = first["meta_info"]["prompt_tokens"]
    assert prompt_tokens > 32
    assert first["meta_info"]["cached_tokens"] == 0
    assert again["meta_info"]["cached_tokens"] > prompt_tokens // 2
    assert other["meta_info"]["cached_tokens"] == 0
    assert plain["meta_info"]["cached_tokens"] == 0
    assert plain_again["meta_info"]["cached_tokens"] > prompt_tokens // 2  # the unsalted namespace shares as before
    assert {o["text"] for o in (first, again, other, plain, plain_again)} == {first["text"]}
    assert_idle_and_whole(client)


def generate_batch(client, texts: list[str], **fields) -> list[dict]:
    r = client.post("/generate", json={"text": texts, "sampling_params": GREEDY, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_batch_salts_each_prompt_on_its_own(client):
    text, (a, b) = fresh_prompt(), fresh_salts(2)
    first = generate(client, text, cache_salt=a)
    prompt_tokens = first["meta_info"]["prompt_tokens"]
    apart = generate_batch(client, [text, text], cache_salt=[a, b])  # one body, two namespaces
    assert apart[0]["meta_info"]["cached_tokens"] > prompt_tokens // 2
    assert apart[1]["meta_info"]["cached_tokens"] == 0
    shared = generate_batch(client, [text, text], extra_key=[b, b])  # SGLang's name; b's prefix is cached now
    assert all(o["meta_info"]["cached_tokens"] > prompt_tokens // 2 for o in shared)
    other = generate_batch(client, [text], cache_salt=fresh_salts(1), sampling_params={**GREEDY, "n": 2})
    assert len(other) == 2 and other[0]["meta_info"]["prompt_tokens"] == prompt_tokens
    assert {o["text"] for o in (first, *apart, *shared, *other)} == {first["text"]}
    assert_idle_and_whole(client)


@pytest.mark.parametrize("fields,param", [
    ({"cache_salt": ["a", "b", "c"]}, "cache_salt"), ({"extra_key": ["a"]}, "extra_key"),
    ({"cache_salt": ["a", 7]}, "cache_salt[1]"), ({"cache_salt": ["a", ""]}, "cache_salt[1]"),
    ({"extra_key": ["a", "b"], "cache_salt": ["a", "c"]}, "extra_key[1]"),
])
def test_a_bad_salt_list_is_a_400_naming_it(client, fields, param):
    r = client.post("/generate", json={"text": ["Hi", "Ho"], "sampling_params": GREEDY, **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_openai_routes_take_the_salt(client):
    s1, s2, s3 = fresh_salts(3)
    text = fresh_prompt()
    chat = {"messages": [{"role": "user", "content": text}], "max_tokens": 4, "temperature": 0}
    replies = [client.post("/v1/chat/completions", json={**chat, "cache_salt": s}).json() for s in (s1, s1, s2)]
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in replies]
    assert cached[0] == 0 and cached[1] > 0 and cached[2] == 0, cached
    assert len({r["choices"][0]["message"]["content"] for r in replies}) == 1

    text = fresh_prompt()
    comp = {"prompt": text, "max_tokens": 4, "temperature": 0}
    replies = [client.post("/v1/completions", json={**comp, **salt}).json()
               for salt in ({"cache_salt": s3}, {}, {"cache_salt": s3})]
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in replies]
    assert cached[0] == 0 and cached[1] == 0 and cached[2] > 0, cached
    assert len({r["choices"][0]["text"] for r in replies}) == 1

    text = fresh_prompt()
    resp = {"input": text, "max_output_tokens": 4, "temperature": 0, "store": False}
    s4, s5 = fresh_salts(2)
    replies = [client.post("/v1/responses", json={**resp, "cache_salt": s}).json() for s in (s4, s4, s5)]
    cached = [r["usage"]["input_tokens_details"]["cached_tokens"] for r in replies]
    assert cached[0] == 0 and cached[1] > 0 and cached[2] == 0, cached
    assert_idle_and_whole(client)


@pytest.mark.parametrize("route,body", [
    ("/generate", {"text": "Hi", "sampling_params": GREEDY}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
])
@pytest.mark.parametrize("salt", ["", 7, ["a"], {"k": "v"}])
def test_a_bad_salt_is_a_400_naming_it(client, route, body, salt):
    r = client.post(route, json={**body, "cache_salt": salt})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "cache_salt", r.text
