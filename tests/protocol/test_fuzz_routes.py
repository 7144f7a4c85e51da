"""Strict intake of the routes beyond /generate and the OpenAI completions, on the keyed server that
test_fuzz_intake runs: the Responses API (/v1/responses), Anthropic's /v1/messages (its own error shape),
llama.cpp's /infill, /tokenize and /detokenize, and the pooling routes on a generation server.

Hypothesis (derandomized) draws each route's bodies from fuzz_bodies' hostile values; every case must answer
below 500 within the bound, a refusal in the route's error shape with a message, on a kept connection.
Valid bodies ask for at most 3 new tokens; a forced tool call or a JSON schema (a grammar that compiles for
seconds) only ever comes with values that are refused. /infill is refused on this model (no fill-in-the-middle
tokens) after its field checks, so its parser is also fuzzed in-process with a template set.
/v1/embeddings and /classify need a pooling model and refuse every body here; /v1/rerank and /v1/score run on the
generation model (its yes / no tokens) and take a valid body.
"""

from __future__ import annotations

import json
import types

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_bodies import (AUTH, CASE_BOUND_S, FUZZ, OPENAI, SERVED, Shape, Tally, anthropic_error, assert_idle_and_whole,
                         assert_serves, check_case, client_addr, either, hostile, ids, j, max_tokens, one_error,
                         one_hostile, post_raw, texts, to_json, typed_stream_end, valid)
from radixlang_runtime.protocol.limits import RuntimeLimits
from radixlang_runtime.server.http_common import parse_json_body
from radixlang_runtime.server.infill_api import parse_infill
from radixlang_runtime.server.responses_request import INCLUDES, SUMMARIES
from server_utils import KEYED_FLAGS, shared_server

ANTHROPIC = Shape(anthropic_error, typed_stream_end("message_stop"))
RESPONSES = Shape(one_error, typed_stream_end("response.completed", "response.incomplete"))


@pytest.fixture(scope="module")
def client():
    srv = shared_server(*KEYED_FLAGS, frontend=True)  # test_fuzz_intake's server
    with httpx.Client(base_url=srv.url, timeout=CASE_BOUND_S, headers=AUTH,
                      limits=httpx.Limits(max_connections=1)) as c:
        yield c


@pytest.fixture
def tally(client):
    t = Tally()
    yield t
    assert_serves(client)
    assert_idle_and_whole(client)


# ------------------------------------------------------------------------------ regressions
# (route, body, status, the field the message names)
REGRESSIONS = {
    "anthropic_empty_user_turn": ("/v1/messages", j({"model": "default", "max_tokens": 1, "messages": [
        {"role": "user", "content": []}]}), 400, "messages[0].content"),
    "anthropic_count_empty_user_turn": ("/v1/messages/count_tokens", j({"model": "default", "messages": [
        {"role": "user", "content": []}]}), 400, "messages[0].content"),
    "anthropic_text_block_null": ("/v1/messages", j({"model": "default", "max_tokens": 1, "messages": [
        {"role": "user", "content": [{"type": "text", "text": None}]}]}), 400, "messages[0].content[0].text"),
    "anthropic_assistant_text_block_int": ("/v1/messages", j({"model": "default", "max_tokens": 1, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": 5}]}]}), 400,
        "messages[1].content[0].text"),
}


@pytest.mark.parametrize("name", list(REGRESSIONS))
def test_regressions_answer_the_exact_4xx_naming_the_field(client, name):
    route, body, status, field = REGRESSIONS[name]
    r, data, _ = post_raw(client, route, body)
    assert r.status_code == status, data[:400]
    shape = ANTHROPIC if route.startswith("/v1/messages") else OPENAI
    assert field in shape.error(json.loads(data), status)
    after = client.post("/generate", json={"text": "ok", "sampling_params": {"max_new_tokens": 1}})
    assert after.status_code == 200
    assert client_addr(after) == r.addr, "the error closed the keep-alive connection"


# ------------------------------------------------------------------------------ bodies
# Each route's bodies, built with `either` (any field may be hostile) or `valid` (all valid, for one_hostile).
def _hostile_or_none(e) -> dict:
    """An unknown top-level field, only where fields may be hostile."""
    return {"unknown_top_level": hostile} if e is either else {}


def _models(e):
    return e(st.sampled_from(["default", SERVED]))


RESP_TOOLS = [{"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}]


def responses_bodies(e) -> st.SearchStrategy:
    part = st.fixed_dictionaries({"type": e(st.sampled_from(["input_text", "output_text", "text"])), "text": texts})
    item = st.one_of(
        st.fixed_dictionaries({"role": e(st.sampled_from(["user", "assistant", "system", "developer"])),
                               "content": e(texts | st.lists(part, max_size=2))},
                              optional={"type": st.just("message")}),
        st.fixed_dictionaries({"type": st.just("function_call"), "call_id": texts, "name": texts,
                               "arguments": e(st.sampled_from(['{"city": "Paris"}', "{}", "{bad"]))}),
        st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": texts, "output": e(texts)}),
        st.fixed_dictionaries({"type": st.just("reasoning"), "summary": e(st.just([]))},
                              optional={"encrypted_content": e(texts)}))
    return st.fixed_dictionaries(
        {"max_output_tokens": max_tokens if e is either else st.integers(1, 3),
         "input": e(texts | st.lists(item, min_size=1, max_size=3))},
        optional={"model": _models(e), "instructions": e(texts),
                  "tools": e(st.just([]) | st.just(RESP_TOOLS)), "tool_choice": e(st.sampled_from(["none", "auto"])),
                  "parallel_tool_calls": e(st.booleans()),
                  "text": e(st.fixed_dictionaries({}, optional={
                      "format": e(st.just({"type": "text"})),
                      "verbosity": e(st.sampled_from(["low", "medium", "high"]))})),
                  "reasoning": e(st.fixed_dictionaries({}, optional={
                      "effort": e(st.sampled_from(["low", "medium", "high"])),
                      "summary": e(st.sampled_from([*SUMMARIES, "none"]))})),
                  "include": e(st.lists(st.sampled_from(INCLUDES), max_size=2)),
                  "previous_response_id": e(st.just("resp_" + "0" * 32) | texts),
                  "store": e(st.booleans()), "stream": e(st.booleans()),
                  "stream_options": e(st.fixed_dictionaries({}, optional={"include_obfuscation": st.booleans()})),
                  "temperature": e(st.floats(0, 2)), "top_p": e(st.floats(0.1, 1)),
                  "top_logprobs": e(st.integers(0, 3)),
                  "metadata": e(st.dictionaries(texts, texts, max_size=3)), "user": e(texts),
                  "background": e(st.just(False)), "truncation": e(st.just("disabled")),
                  "service_tier": e(st.sampled_from(["auto", "default"])), **_hostile_or_none(e)})


A_TOOLS = [{"name": "get_weather", "description": "weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}}}]


def messages_bodies(e) -> st.SearchStrategy:
    block = st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": e(texts)},
                              optional={"cache_control": e(st.just({"type": "ephemeral"}))}),
        st.fixed_dictionaries({"type": st.just("tool_use"), "id": e(texts), "name": e(texts),
                               "input": e(st.just({"city": "Paris"}))}),
        st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": e(texts),
                               "content": e(texts)}, optional={"is_error": e(st.booleans())}),
        st.fixed_dictionaries({"type": st.just("thinking"), "thinking": e(texts), "signature": e(texts)}),
        st.fixed_dictionaries({"type": e(st.sampled_from(["image", "redacted_thinking", "nope"]))}))
    message = st.fixed_dictionaries({"role": e(st.sampled_from(["user", "assistant"])),
                                     "content": e(texts | st.lists(block, max_size=2))})
    return st.fixed_dictionaries(
        {"model": _models(e), "max_tokens": max_tokens if e is either else st.integers(1, 3),
         "messages": e(st.lists(message, min_size=1, max_size=3))},
        optional={"system": e(texts | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
                                               max_size=2)),
                  "tools": e(st.just([]) | st.just(A_TOOLS)),
                  "tool_choice": e(st.sampled_from([{"type": "auto"}, {"type": "none"},
                                                    {"type": "auto", "disable_parallel_tool_use": True}])),
                  "stop_sequences": e(st.lists(st.text(min_size=1, max_size=3), max_size=2)),
                  "temperature": e(st.floats(0, 1)), "top_p": e(st.floats(0.1, 1)),
                  "top_k": e(st.integers(1, 50)), "stream": e(st.booleans()),
                  "metadata": e(st.fixed_dictionaries({}, optional={"user_id": texts})),
                  "thinking": e(st.just({"type": "disabled"})), "chat_template_kwargs": e(st.just({})),
                  "service_tier": e(st.sampled_from(["auto", "standard_only"])), **_hostile_or_none(e)})


def infill_bodies(e) -> st.SearchStrategy:
    extra = st.lists(st.fixed_dictionaries({}, optional={"filename": e(texts), "text": e(texts),
                                                         "time": e(st.integers())}), max_size=2)
    stops = st.lists(st.text(min_size=1, max_size=3), max_size=2)
    stages = st.lists(st.sampled_from(["temperature", "top_k", "top_p", "min_p", "infill", "typ_p"]), max_size=4)
    paths = st.lists(st.sampled_from(["content", "stop", "timings/prompt_n", "a/b/c"]), max_size=3)
    return st.fixed_dictionaries(
        {"n_predict": max_tokens if e is either else st.integers(0, 3)},
        optional={"input_prefix": e(texts), "input_suffix": e(texts), "input_extra": e(extra), "prompt": e(texts),
                  "stream": e(st.booleans()), "cache_prompt": e(st.booleans()), "temperature": e(st.floats(0, 2)),
                  "top_k": e(st.sampled_from([-1, 1, 40])), "top_p": e(st.floats(0.1, 1)),
                  "min_p": e(st.floats(0, 1)), "repeat_penalty": e(st.floats(0.5, 2)),
                  "presence_penalty": e(st.floats(-2, 2)), "frequency_penalty": e(st.floats(-2, 2)),
                  "stop": e(stops), "seed": e(st.sampled_from([-1, 0, 7])), "ignore_eos": e(st.booleans()),
                  "samplers": e(stages), "penalty_last_n": e(st.sampled_from([-1, 0, 64])),
                  "n_indent": e(st.integers(-1, 8)), "t_max_prompt_ms": e(st.integers(-1, 500)),
                  "t_max_predict_ms": e(st.integers(-1, 500)), "response_fields": e(paths), **_hostile_or_none(e)})


def tokenize_bodies(e) -> st.SearchStrategy:
    chat = st.lists(st.fixed_dictionaries({"role": e(st.sampled_from(["system", "user", "assistant"])),
                                           "content": e(texts)}), min_size=1, max_size=3)
    return st.one_of(
        st.fixed_dictionaries({"prompt": e(texts | st.lists(texts, min_size=1, max_size=3))}, optional={
            "add_special_tokens": e(st.booleans()), "return_token_strs": e(st.booleans()),
            "suffix": e(st.just("")), "model": _models(e)}),
        st.fixed_dictionaries({"messages": e(chat)}, optional={
            "add_generation_prompt": e(st.booleans()), "continue_final_message": e(st.booleans()),
            "add_special_tokens": e(st.booleans()), "chat_template_kwargs": e(st.just({})),
            "reasoning_effort": e(st.sampled_from(["low", "high"])), "return_token_strs": e(st.booleans())}))


detokenize_body = st.fixed_dictionaries(
    {"tokens": either(ids | st.lists(ids, min_size=1, max_size=2) | st.lists(st.integers(), max_size=3))},
    optional={"skip_special_tokens": either(st.booleans()), "model": _models(either), "unknown_top_level": hostile})


def pooling_bodies(e) -> st.SearchStrategy:
    docs = st.lists(texts, min_size=1, max_size=2)
    return st.one_of(
        st.fixed_dictionaries({"input": e(texts | docs | ids)}, optional={
            "model": _models(e), "encoding_format": e(st.just("float")), "dimensions": e(st.integers(1, 4))}),
        st.fixed_dictionaries({"query": e(texts), "documents": e(docs)}, optional={
            "top_n": e(st.integers(0, 3)), "return_documents": e(st.booleans()), "model": _models(e)}),
        st.fixed_dictionaries({"text_1": e(texts | docs), "text_2": e(texts | docs)}))


responses_body, messages_body, infill_body = responses_bodies(either), messages_bodies(either), infill_bodies(either)
tokenize_body = tokenize_bodies(either) | hostile
pooling_body = pooling_bodies(either) | hostile
# a valid body of any of these routes with one value made hostile, at any depth
NESTED = {"/v1/responses": one_hostile(responses_bodies(valid)), "/v1/messages": one_hostile(messages_bodies(valid)),
          "/tokenize": one_hostile(tokenize_bodies(valid)), "/v1/rerank": one_hostile(pooling_bodies(valid)),
          "/v1/score": one_hostile(pooling_bodies(valid))}


# ------------------------------------------------------------------------------ fuzz
@settings(FUZZ, max_examples=35)
@given(body=responses_body)
def test_fuzz_responses(client, tally, body):
    check_case(client, "/v1/responses", body, tally, RESPONSES)


@settings(FUZZ, max_examples=35)
@given(body=messages_body)
def test_fuzz_anthropic_messages(client, tally, body):
    check_case(client, "/v1/messages", body, tally, ANTHROPIC)


@settings(FUZZ, max_examples=25)
@given(body=infill_body)
def test_fuzz_infill(client, tally, body):
    check_case(client, "/infill", body, tally)


@settings(FUZZ, max_examples=25)
@given(body=tokenize_body)
def test_fuzz_tokenize(client, tally, body):
    check_case(client, "/tokenize", body, tally)


@settings(FUZZ, max_examples=25)
@given(body=detokenize_body)
def test_fuzz_detokenize(client, tally, body):
    check_case(client, "/detokenize", body, tally)


@settings(FUZZ, max_examples=20)
@given(route=st.sampled_from(["/v1/embeddings", "/classify"]), body=pooling_body)
def test_fuzz_pooling_routes_refuse_on_a_generation_server(client, tally, route, body):
    r, data, _ = post_raw(client, route, to_json(body))
    assert 400 <= r.status_code < 500, (r.status_code, data[:500])
    one_error(json.loads(data), r.status_code)
    check_case(client, route, body, tally)


@settings(FUZZ, max_examples=20)
@given(route=st.sampled_from(["/v1/rerank", "/v1/score"]), body=pooling_body)
def test_fuzz_rerank_and_score(client, tally, route, body):
    check_case(client, route, body, tally)


@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_fuzz_one_hostile_value_deep_in_a_valid_body(client, tally, data):
    route = data.draw(st.sampled_from(list(NESTED)), label="route")
    check_case(client, route, data.draw(NESTED[route], label="body"), tally,
               ANTHROPIC if route == "/v1/messages" else RESPONSES if route == "/v1/responses" else OPENAI)


# ------------------------------------------------------------------------------ /infill's parser, in-process
FIM_STATE = types.SimpleNamespace(fim=object(), tm=types.SimpleNamespace(limits=RuntimeLimits(8192, 49152, 64)))


@settings(FUZZ, max_examples=150)
@given(body=infill_body | one_hostile(infill_bodies(valid)))
def test_fuzz_infill_parser_with_a_template(body):
    """On a fill-in-the-middle model every body parses or is refused with a 400 (ValueError), never another error."""
    try:
        parsed = parse_json_body(to_json(body))
    except ValueError:
        return  # refused before any route reads it (BadRequest / FieldError: deep nesting, NaN): the server cases
    try:
        parse_infill(FIM_STATE, parsed)
    except ValueError as e:
        assert str(e)
