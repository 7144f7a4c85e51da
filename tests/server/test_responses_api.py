"""/v1/responses against one real server on the embedded model (--debug-check-integrity: the KV pool is
checked whole at every step) with the real clients: the openai SDK's responses.create / .stream / retrieve /
delete, and an OpenAI Agents SDK program written the default way (the Responses API, a default client)."""

from __future__ import annotations

import json

import httpx
import httpx2
import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_utils import ServerProcess

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["London", "Paris", "Tokyo"]}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Get the current weather in a city.",
          "parameters": WEATHER, "strict": True}]
PAGE = 16  # the CPU page size: the radix cache matches whole pages


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--max-total-tokens", "8192", "--debug-check-integrity", "--responses-store-max-entries", "64")
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120)


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def test_plain_create_matches_chat_completions(oai):
    r = oai.responses.create(model="default", instructions="Be brief.", input="What is the capital of France?",
                             max_output_tokens=12, temperature=0, metadata={"run": "a"})
    chat = oai.chat.completions.create(model="default", max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}])
    assert r.id.startswith("resp_") and r.object == "response" and r.metadata == {"run": "a"}
    assert r.max_output_tokens == 12 and r.temperature == 0
    assert [o.type for o in r.output] == ["message"]
    assert r.output_text == chat.choices[0].message.content and r.output_text
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    u = r.usage
    assert (u.input_tokens, u.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert u.total_tokens == u.input_tokens + u.output_tokens and u.input_tokens_details.cached_tokens >= 0


@pytest.mark.parametrize("choice", [{"type": "function", "name": "get_weather"}, "required"])
def test_forced_function_call_then_its_output_by_previous_response_id(oai, choice):
    r = oai.responses.create(model="default", input="What is the weather in Paris?", tools=TOOLS, tool_choice=choice,
                             max_output_tokens=60, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) >= 1 and all(c.name == "get_weather" for c in calls)
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    assert calls[0].call_id and calls[0].id.startswith("fc_") and r.status == "completed"
    follow = oai.responses.create(model="default", previous_response_id=r.id, tools=TOOLS, max_output_tokens=8,
                                  temperature=0, input=[{"type": "function_call_output", "call_id": c.call_id,
                                                         "output": "17 C and sunny"} for c in calls])
    assert follow.previous_response_id == r.id and follow.output_text
    # the first turn (its prompt and the call) is the cached prefix of the second
    assert follow.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens - PAGE


def test_text_format_json_schema_and_json_object(oai):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "city": {"type": "string", "enum": ["London", "Paris"]}},
              "required": ["name", "city"], "additionalProperties": False}
    r = oai.responses.create(model="default", input="Make up a person.", max_output_tokens=60, temperature=0,
                             text={"format": {"type": "json_schema", "name": "person", "schema": schema,
                                              "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"
    r = oai.responses.create(model="default", input="Describe a cat as JSON.", max_output_tokens=12, temperature=0,
                             text={"format": {"type": "json_object"}})
    assert r.output_text.lstrip().startswith("{")


COLOR = {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]}},
         "required": ["color"], "additionalProperties": False}


def _stream_kinds(events: list, deltas: int) -> list[str]:
    return ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
            *["response.output_text.delta"] * deltas, "response.output_text.done", "response.content_part.done",
            "response.output_item.done"]


def test_stream_events_reassemble_to_the_final_response(oai):
    """A schema-bound reply ends before max_output_tokens (the grammar closes it): response.completed."""
    kwargs = dict(model="default", input="Pick a color.", max_output_tokens=40, temperature=0,
                  text={"format": {"type": "json_schema", "name": "color", "schema": COLOR}})
    whole = oai.responses.create(**kwargs)
    with oai.responses.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert [e.type for e in events] == _stream_kinds(events, len(deltas)) + ["response.completed"]
    assert len(deltas) > 1 and "".join(deltas) == whole.output_text == final.output_text
    jsonschema.validate(json.loads(final.output_text), COLOR)
    assert final.status == whole.status == "completed" and final.usage.output_tokens == whole.usage.output_tokens


def test_stream_cut_by_max_output_tokens_ends_as_the_create_does(oai):
    kwargs = dict(model="default", input="Name three colors.", max_output_tokens=3, temperature=0)
    whole = oai.responses.create(**kwargs)
    with oai.responses.stream(**kwargs) as stream:
        events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert [e.type for e in events] == _stream_kinds(events, len(deltas)) + [f"response.{whole.status}"]
    assert "".join(deltas) == whole.output_text == events[-1].response.output_text
    assert events[-1].response.incomplete_details == whole.incomplete_details


def test_stream_a_forced_call(oai):
    with oai.responses.stream(model="default", input="What is the weather in Tokyo?", tools=TOOLS,
                              tool_choice="required", parallel_tool_calls=False, max_output_tokens=60,
                              temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    calls = [o for o in final.output if o.type == "function_call"]
    assert len(done) == 1 == len(calls) and done[0].name == "get_weather"
    assert "".join(pieces) == done[0].arguments == calls[0].arguments
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)


def test_a_ten_turn_chain_reads_its_history_from_the_cache(oai):
    prev, usages = None, []
    for turn in range(10):
        r = oai.responses.create(model="default", instructions="Be brief.", previous_response_id=prev,
                                 input=f"Tell me fact number {turn + 1} about cats.", max_output_tokens=4,
                                 temperature=0)
        prev = r.id
        usages.append((r.usage.input_tokens, r.usage.input_tokens_details.cached_tokens))
    for (prev_input, _), (input_len, cached) in zip(usages, usages[1:]):
        # every earlier turn's prompt is cached, up to the last partial page
        assert input_len > prev_input and prev_input - PAGE <= cached <= input_len, usages


def test_retrieve_delete_and_store_false(oai, client):
    r = oai.responses.create(model="default", input="Say hi.", max_output_tokens=4, temperature=0)
    assert oai.responses.retrieve(r.id).output_text == r.output_text
    oai.responses.delete(r.id)
    for call in (lambda: oai.responses.retrieve(r.id), lambda: oai.responses.delete(r.id)):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert r.id in e.value.body["message"]
    kept = oai.responses.create(model="default", input="Say hi.", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(kept.id)
    resp = client.post("/v1/responses", json={"input": "x", "previous_response_id": kept.id})
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "previous_response_id"
    assert kept.id in resp.json()["error"]["message"]


def test_the_fields_the_sdks_send_by_default_are_taken(oai):
    """The Agents SDK's default model settings: verbosity and a reasoning effort (and include: []); a
    summary asked of a server without --reasoning-parser: no reasoning item."""
    r = oai.responses.create(model="default", input="Say hi.", max_output_tokens=4, text={"verbosity": "low"},
                             reasoning={"effort": "none", "summary": "detailed"}, include=[], prompt_cache_key="k",
                             user="u")
    assert r.status in ("completed", "incomplete") and r.user == "u" and [o.type for o in r.output] == ["message"]
    chat = oai.chat.completions.create(model="default", max_tokens=4, verbosity="low", reasoning_effort="none",
                                       store=False, messages=[{"role": "user", "content": "Say hi."}])
    assert chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="default", max_tokens=4, verbosity="loud",
                                    messages=[{"role": "user", "content": "x"}])
    assert e.value.body["param"] == "verbosity"


def _lp(entries) -> list[tuple]:
    return [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in entries]


@pytest.mark.parametrize("ask, tokens, status", [("Name a color.", 5, "incomplete"),  # cut by max_output_tokens
                                                 ("What is 2+2?", 30, "completed")])  # ends on <|im_end|>
def test_output_text_logprobs_are_the_chat_routes(oai, ask, tokens, status):
    """include message.output_text.logprobs with top_logprobs: the chat route's logprobs for the same greedy
    request, on the output_text part; streamed, the text deltas carry each token once (the end-of-turn token,
    whose text is empty, on an empty delta) and the done events all of them."""
    kwargs = dict(model="default", input=ask, max_output_tokens=tokens, temperature=0,
                  include=["message.output_text.logprobs"], top_logprobs=2)
    r = oai.responses.create(**kwargs)
    chat = oai.chat.completions.create(model="default", messages=[{"role": "user", "content": ask}],
                                       max_tokens=tokens, temperature=0, logprobs=True, top_logprobs=2)
    part = r.output[0].content[0]
    want = _lp(chat.choices[0].logprobs.content)
    assert _lp(part.logprobs) == want and len(want) == r.usage.output_tokens and r.status == status
    assert all(len(top) == 2 for _, _, top in want) and r.top_logprobs == 2
    assert [e.bytes for e in part.logprobs] == [list(e.token.encode()) for e in part.logprobs]
    with oai.responses.stream(**kwargs) as stream:
        events = list(stream)
    final = events[-1].response
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    done = [e for e in events if e.type == "response.output_text.done"]
    assert [lp for e in deltas for lp in _lp(e.logprobs)] == want and _lp(done[0].logprobs) == want
    assert "".join(e.delta for e in deltas) == done[0].text == r.output_text
    assert _lp(final.output[0].content[0].logprobs) == want and final.status == status
    assert oai.responses.create(**{**kwargs, "include": [], "top_logprobs": 0}).output[0].content[0].logprobs == []


@pytest.mark.parametrize("body, status, param", [
    ({"input": "x", "frobnicate": 1}, 400, "frobnicate"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "input[0]"),
    ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, 400, "tool_choice"),
    ({"input": "x", "tools": TOOLS, "tool_choice": "sometimes"}, 400, "tool_choice"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "tools"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "nope"}}}}, 400,
     "nope"),
    ({"input": "x", "model": "gpt-unknown"}, 404, "model"),
    ({"input": "x", "previous_response_id": "resp_missing"}, 404, "previous_response_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "not json"}]}, 400,
     "input[0].arguments"),
    ({"input": "x", "temperature": -1}, 400, "temperature"),
    ({"input": "x", "include": ["file_search_call.results"]}, 400, "include"),
    ({"input": "x", "top_logprobs": 2}, 400, "top_logprobs"),
    ({"input": "x", "include": ["message.output_text.logprobs"], "top_logprobs": 21}, 400, "top_logprobs"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "e30="}]}, 400, "input[0].encrypted_content"),
    ([1, 2], 400, "JSON object"),
])
def test_bad_input_answers_4xx_in_openai_shape(client, body, status, param):
    """`param` is the field the error names: in `param`, or in the message where the grammar backend names it."""
    resp = client.post("/v1/responses", json=body)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and param in (err["param"] or "") + " " + err["message"], err
    assert client.get("/v1/responses/resp_missing").status_code == 404


def test_agents_sdk_written_the_default_way(server):
    """No ChatCompletions model: a default client and the default (Responses) API. The settings start from
    the SDK's defaults (verbosity, reasoning effort) with the first turn's call forced (a 135M model does not
    call unprompted; reset_tool_choice lets the second turn answer)."""
    from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled
    from agents.models.default_models import get_default_model_settings
    from openai import AsyncOpenAI

    sent: list[dict] = []

    async def record(request) -> None:
        sent.append({"path": request.url.path, **json.loads(request.read())})

    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", http_client=httpx2.AsyncClient(
        event_hooks={"request": [record]}, timeout=120)))
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return f"17 C and sunny in {city}"

    settings = get_default_model_settings().resolve(ModelSettings(tool_choice="required", temperature=0,
                                                                  max_tokens=48))
    assert settings.verbosity is not None and settings.reasoning is not None  # the SDK's defaults, sent below
    agent = Agent(name="weather", instructions="Answer in one sentence.", tools=[get_weather], model="default",
                  model_settings=settings)
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=3)
    assert len(calls) == 1 and calls[0] and isinstance(result.final_output, str) and result.final_output
    assert [b["path"] for b in sent] == ["/v1/responses", "/v1/responses"]
    assert sent[0]["text"]["verbosity"] == settings.verbosity and sent[0]["tool_choice"] == "required"
    assert sent[0]["reasoning"]["effort"] == settings.reasoning.effort
    outputs = [i for i in sent[1]["input"] if i.get("type") == "function_call_output"]
    assert [o["output"] for o in outputs] == [f"17 C and sunny in {calls[0]}"]


_ANY = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                 st.text(max_size=6), st.lists(st.integers(-3, 3), max_size=2),
                 st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
_PART = st.one_of(_ANY, st.fixed_dictionaries({
    "type": st.sampled_from(["input_text", "output_text", "input_image", "x"]),
    "text": st.one_of(st.text(max_size=6), _ANY)}))
_ITEM = st.one_of(_ANY, st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "item_reference"])},
    optional={"role": st.sampled_from(["user", "assistant", "system", "developer", "tool", "x"]),
              "content": st.one_of(st.text(max_size=6), st.lists(_PART, max_size=2), _ANY),
              "call_id": st.one_of(st.just("c1"), _ANY), "name": st.one_of(st.just("get_weather"), _ANY),
              "arguments": st.one_of(st.just("{\"city\": \"Paris\"}"), st.just("{"), _ANY),
              "output": st.one_of(st.text(max_size=6), _ANY)}))
_BODY = st.fixed_dictionaries(
    {"input": st.one_of(st.text(max_size=8), st.lists(_ITEM, max_size=3), _ANY), "max_output_tokens": st.just(1)},
    optional={"tools": st.one_of(st.just(TOOLS), _ANY, st.lists(st.dictionaries(
                  st.sampled_from(["type", "name", "parameters"]), _ANY, max_size=3), max_size=1)),
              "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required"]),
                                       st.just({"type": "function", "name": "get_weather"}), _ANY),
              "text": st.one_of(st.just({"format": {"type": "json_object"}}), st.dictionaries(
                  st.sampled_from(["format", "verbosity"]), _ANY, max_size=2), _ANY),
              "reasoning": st.one_of(st.just({"effort": "low"}), st.dictionaries(
                  st.sampled_from(["effort", "summary", "context"]), _ANY, max_size=2), _ANY),
              "temperature": _ANY, "top_p": _ANY, "metadata": _ANY, "store": _ANY, "include": _ANY,
              "previous_response_id": _ANY, "instructions": _ANY, "parallel_tool_calls": _ANY, "user": _ANY})


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(body=_BODY)
def test_fuzzed_bodies_never_reach_a_500(client, body):
    resp = client.post("/v1/responses", json=body)
    assert resp.status_code in (200, 400, 404), resp.text
    if resp.status_code != 200:
        err = resp.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"]
    else:
        assert resp.json()["object"] == "response"
