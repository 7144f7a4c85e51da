"""The reasoning watch on a real server (the embedded model, float32, `--reasoning-parser deepseek-r1`, so every
output starts inside the reasoning block; with the overlap schedule on). A thinking budget of B gives the model's
first B greedy tokens, then the end marker `</think>` as the tokenizer encodes it, then the greedy continuation
of that text (each checked token for token against /generate without a budget); the chat route splits that
output into reasoning and content, streamed or not; concurrent requests with and without budgets answer as
alone; a budget that is never spent changes nothing; Anthropic's `thinking` runs the same budget. A chat
request's grammar (response_format) waits for the reasoning's end: with a budget the answer after the forced
marker is the schema's JSON (token for token what /generate's grammar gives from there), without one the
unclosed reasoning runs unconstrained. What cannot be honoured is a 400 naming the field."""

from __future__ import annotations

import concurrent.futures
import json

import anthropic
import httpx
import pytest

from radixlang_runtime.reasoning_parser import DeepSeekR1Parser
from server_utils import FP32_FLAGS, R1_FLAGS, assert_idle_and_whole, shared_server

ASK = [{"role": "user", "content": "Write a long story about a dragon who learns to paint."}]


@pytest.fixture(scope="module")
def server():
    return shared_server(*R1_FLAGS)


def post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=120)


def generate(srv, ids: list[int], n: int, **sp) -> dict:
    r = post(srv, "/generate", {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": n, **sp}})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def prompt(server) -> list[int]:
    r = post(server, "/tokenize", {"messages": ASK, "add_generation_prompt": True})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


@pytest.fixture(scope="module")
def end_ids(server) -> list[int]:
    return post(server, "/tokenize", {"prompt": "</think>", "add_special_tokens": False}).json()["tokens"]


def expected_ids(server, prompt: list[int], end_ids: list[int], budget: int, n: int) -> list[int]:
    head = generate(server, prompt, budget)["output_ids"]
    assert len(head) == budget  # the model thinks on past the budget (the test could fail)
    head += end_ids
    return head + generate(server, prompt + head, n - len(head))["output_ids"]


@pytest.mark.parametrize("budget", [0, 1, 6])
def test_the_budget_then_the_end_marker_then_greedy_again(server, prompt, end_ids, budget):
    out = generate(server, prompt, 24, thinking_token_budget=budget)
    assert out["output_ids"] == expected_ids(server, prompt, end_ids, budget, 24)
    assert out["meta_info"]["completion_tokens"] == 24


def test_the_chat_route_splits_the_forced_output(server, prompt):
    raw = generate(server, prompt, 24, thinking_token_budget=6)["text"]
    want = DeepSeekR1Parser.parse(raw)
    assert want.reasoning and want.content  # both halves present: the split is tested
    body = {"model": "default", "messages": ASK, "temperature": 0, "max_tokens": 24, "thinking_token_budget": 6}
    msg = post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == (want.reasoning, want.content)
    reasoning, content = "", ""
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        lines = r.iter_lines()  # kept referenced: a dropped iterator would close the stream
        for line in lines:
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"]
                reasoning += delta.get("reasoning_content") or ""
                content += delta.get("content") or ""
    assert (reasoning, content) == (want.reasoning, want.content)


def test_a_budget_never_spent_changes_nothing(server, prompt):
    assert generate(server, prompt, 10, thinking_token_budget=50)["output_ids"] == \
        generate(server, prompt, 10)["output_ids"]


def test_concurrent_requests_answer_as_alone(server, prompt, end_ids):
    jobs = [(prompt, 20, {"thinking_token_budget": b}) for b in (2, 5, 9)] + \
           [(prompt[:-3], 16, {}), (prompt[:-5], 12, {})]
    alone = [generate(server, p, n, **sp)["output_ids"] for p, n, sp in jobs]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        together = list(pool.map(lambda j: generate(server, j[0], j[1], **j[2])["output_ids"], jobs))
    assert together == alone
    assert alone[1] == expected_ids(server, prompt, end_ids, 5, 20)
    with httpx.Client(base_url=server.url, timeout=30) as c:
        assert_idle_and_whole(c)


def test_anthropic_thinking_runs_the_same_budget(server):
    """A short answer (the model ends it itself): Anthropic's least budget, 1024, is a long generation here."""
    sdk = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    hi = [{"role": "user", "content": "Say hi."}]
    reply = sdk.messages.create(model="default", max_tokens=1100, messages=hi, extra_body={"temperature": 0},
                                thinking={"type": "enabled", "budget_tokens": 1024})
    chat = post(server, "/v1/chat/completions", {"messages": hi, "temperature": 0, "max_tokens": 1100,
                                                 "thinking_token_budget": 1024}).json()
    msg = chat["choices"][0]["message"]
    assert chat["choices"][0]["finish_reason"] == "stop" and chat["usage"]["completion_tokens"] < 100
    assert reply.content[0].type == "thinking" and reply.content[0].thinking == msg["reasoning_content"]
    assert reply.usage.output_tokens == chat["usage"]["completion_tokens"]
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        sdk.messages.create(model="default", max_tokens=2000, messages=ASK,
                            thinking={"type": "enabled", "budget_tokens": 100})


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}}, "required": ["name"]}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}


def test_a_chat_grammar_waits_for_the_reasoning_to_end(server, prompt, end_ids):
    body = {"messages": ASK, "temperature": 0, "max_tokens": 40, "response_format": JSON_FORMAT,
            "thinking_token_budget": 5}
    out = post(server, "/v1/chat/completions", body).json()
    msg = out["choices"][0]["message"]
    assert json.loads(msg["content"]).keys() == {"name"}
    head = generate(server, prompt, 5)["output_ids"] + end_ids  # unconstrained reasoning, the forced marker
    answer = generate(server, prompt + head, 40 - len(head), json_schema=json.dumps(PERSON))
    assert msg["content"] == answer["text"]
    assert msg["reasoning_content"] == DeepSeekR1Parser.parse(generate(server, prompt, 5)["text"]).reasoning
    raw = generate(server, prompt, 40, thinking_token_budget=5, json_schema=json.dumps(PERSON))
    assert raw["output_ids"] == head + answer["output_ids"]  # /generate: a budget holds its grammar too


def test_an_unclosed_reasoning_runs_unconstrained(server, prompt):
    body = {"messages": ASK, "temperature": 0, "max_tokens": 12, "response_format": JSON_FORMAT}
    msg = post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]
    free = generate(server, prompt, 12)["text"]
    assert not free.lstrip().startswith("{")  # the grammar would have made it JSON (the test could fail)
    assert (msg["reasoning_content"], msg["content"]) == (DeepSeekR1Parser.parse(free).reasoning, "")


@pytest.mark.parametrize("extra,named", [
    ({"thinking_token_budget": -1}, "thinking_token_budget"),
    ({"thinking_token_budget": "5"}, "thinking_token_budget"),
])
def test_what_cannot_be_honoured_is_a_400(server, extra, named):
    r = post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 4, **extra})
    assert r.status_code == 400 and named in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "thinking_token_budget"


def test_a_server_without_a_reasoning_parser_refuses_a_budget():
    srv = shared_server(*FP32_FLAGS)
    r = post(srv, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 4, "thinking_token_budget": 3}})
    assert r.status_code == 400 and "without --reasoning-parser" in r.json()["error"]["message"], r.text


def test_a_forced_tool_call_after_a_budgeted_reasoning(server):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}}}]
    body = {"messages": ASK, "temperature": 0, "max_tokens": 60, "tools": tools, "tool_choice": "required",
            "thinking_token_budget": 3}
    out = post(server, "/v1/chat/completions", body).json()
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls", out
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]).keys() == {"city"}
    free = post(server, "/v1/chat/completions", {**body, "tool_choice": "auto", "max_tokens": 6}).json()
    reasoning = free["choices"][0]["message"]["reasoning_content"]  # the budget's tokens, unconstrained
    assert reasoning and choice["message"]["reasoning_content"] == reasoning
