"""/v1/responses with a --reasoning-parser on a real server, the way agent clients ask for reasoning:
`reasoning.summary` (the summary is the reasoning text the chat route gives for the same greedy request) and
`include: ["reasoning.encrypted_content"]` with `store: false` (the reasoning item sent back in the next
turn's `input`, as Codex does). The parser is `deepseek-r1`: the output starts inside the reasoning, so the
135M model's short greedy reply is all reasoning, with no regex to force a `<think>` block."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from server_utils import R1_FLAGS, shared_server

ASK = "What is the capital of France?"
REASONING = {"effort": "medium", "summary": "auto"}


@pytest.fixture(scope="module")
def server():
    return shared_server(*R1_FLAGS)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120)


@pytest.fixture(scope="module")
def chat_reasoning(oai) -> str:
    r = oai.chat.completions.create(model="default", messages=[{"role": "user", "content": ASK}], max_tokens=8,
                                    temperature=0)
    assert r.choices[0].message.reasoning_content  # the whole cut-off output is reasoning
    return r.choices[0].message.reasoning_content


def test_the_summary_is_the_chat_routes_reasoning(oai, chat_reasoning):
    kwargs = dict(model="default", input=ASK, max_output_tokens=8, temperature=0, reasoning=REASONING,
                  include=["reasoning.encrypted_content"], store=False)
    r = oai.responses.create(**kwargs)
    rs = r.output[0]
    assert rs.type == "reasoning" and rs.encrypted_content and r.reasoning.summary == "auto"
    assert [s.text for s in rs.summary] == [chat_reasoning] == [c.text for c in rs.content]
    with oai.responses.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    summary = [e.delta for e in events if e.type == "response.reasoning_summary_text.delta"]
    content = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert summary == content and "".join(summary) == chat_reasoning
    first = kinds.index("response.reasoning_summary_part.added")
    last = kinds.index("response.reasoning_summary_part.done")
    assert kinds.index("response.content_part.added") < first < kinds.index("response.reasoning_summary_text.delta")
    assert kinds.index("response.reasoning_summary_text.done") + 1 == last < kinds.index("response.output_item.done")
    done = events[last - 1]
    assert done.text == chat_reasoning and events[last].part.text == chat_reasoning
    assert final.output[0].summary[0].text == chat_reasoning and final.output[0].encrypted_content
    # without a summary asked: none, and no summary event
    plain = oai.responses.create(**{**kwargs, "reasoning": {"effort": "low"}, "include": []})
    assert plain.output[0].summary == [] and plain.output[0].encrypted_content is None
    assert plain.output[0].content[0].text == chat_reasoning


def test_logprobs_of_a_reply_of_only_reasoning_streamed_as_created(oai):
    """The whole cut-off reply is reasoning: the create's output is the reasoning item and an empty message
    whose output_text part carries every token's logprobs; the stream ends on the same output, its text deltas
    carrying those logprobs once each."""
    kwargs = dict(model="default", input=ASK, max_output_tokens=8, temperature=0,
                  include=["message.output_text.logprobs"], top_logprobs=1)
    r = oai.responses.create(**kwargs)
    lp = [(e.token, e.logprob) for e in r.output[-1].content[0].logprobs]
    assert [o.type for o in r.output] == ["reasoning", "message"] and len(lp) == r.usage.output_tokens == 8
    with oai.responses.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_response()
    sent = [(x.token, x.logprob) for e in events if e.type == "response.output_text.delta" for x in e.logprobs]
    done = [[(x.token, x.logprob) for x in e.logprobs] for e in events if e.type == "response.output_text.done"]
    assert sent == lp and done == [lp]
    assert [o.type for o in final.output] == ["reasoning", "message"] and final.output_text == r.output_text == ""
    assert [(x.token, x.logprob) for x in final.output[-1].content[0].logprobs] == lp


def _codex_body(items: list[dict]) -> dict:
    """The request Codex's Responses client sends: stream, store false, the encrypted reasoning included."""
    return {"model": "default", "instructions": "Be brief.", "input": items, "tools": [], "tool_choice": "auto",
            "parallel_tool_calls": False, "reasoning": REASONING, "store": False, "stream": True,
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "thread-1", "max_output_tokens": 6,
            "temperature": 0}


def _run(client: httpx.Client, body: dict) -> dict:
    """A streamed request's final response object (the lines iterator kept while it streams)."""
    with client.stream("POST", "/v1/responses", json=body) as resp:
        assert resp.status_code == 200, resp.read()
        lines = resp.iter_lines()
        events = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    return events[-1]["response"]


def test_encrypted_reasoning_sent_back_as_codex_does(server):
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]}
    with httpx.Client(base_url=server.url, timeout=120) as client:
        first = _run(client, _codex_body([user]))
        rs, msg = first["output"][0], first["output"][-1]
        assert rs["type"] == "reasoning" and rs["summary"][0]["text"] == rs["content"][0]["text"]
        back = {"type": "reasoning", "summary": rs["summary"], "content": None,
                "encrypted_content": rs["encrypted_content"]}  # no id: Codex does not send it
        nxt = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And of Spain?"}]}
        with_item = _run(client, _codex_body([user, back, msg, nxt]))
        without = _run(client, _codex_body([user, msg, nxt]))
        # taken onto the assistant turn; the embedded model's template does not show reasoning: the same prompt
        assert with_item["usage"]["input_tokens"] == without["usage"]["input_tokens"]
        assert [(o["type"], o.get("content")) for o in with_item["output"]] == \
            [(o["type"], o.get("content")) for o in without["output"]]
        sealed = rs["encrypted_content"]
        tampered = {**back, "encrypted_content": sealed[:40] + ("A" if sealed[40] != "A" else "B") + sealed[41:]}
        resp = client.post("/v1/responses", json={**_codex_body([user, tampered, msg, nxt]), "stream": False})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "input[1].encrypted_content", resp.text


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "reasoning": {"summary": "verbose"}}, "reasoning.summary"),
    ({"input": "x", "include": ["code_interpreter_call.outputs"]}, "include"),
    ({"input": "x", "top_logprobs": 3}, "top_logprobs"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "bm90IHNlYWxlZA=="}]},
     "input[0].encrypted_content"),
])
def test_refusals_name_the_field(oai, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="default", max_output_tokens=2, **body)
    assert e.value.body["param"] == param and e.value.body["type"] == "invalid_request_error"
