"""Constrained decoding through the real server: the openai SDK's response_format (json_schema strict,
json_object) on chat and completions, native /generate with regex / json_schema, and hostile grammars
answering 400 while the server keeps serving with bounded memory."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import psutil
import pytest

from server_utils import ServerProcess
from server_utils import assert_idle_and_whole

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--dtype", "float32", "--max-total-tokens", "8192", "--debug-check-integrity")
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_openai_response_format_json_schema_and_json_object(oai):
    msgs = [{"role": "user", "content": "Describe a person as JSON."}]
    r = oai.chat.completions.create(model="default", messages=msgs, max_tokens=64, temperature=0,
                                    response_format={"type": "json_schema", "json_schema": {
                                        "name": "person", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    r = oai.chat.completions.create(model="default", messages=msgs, max_tokens=96, temperature=0,
                                    response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    c = oai.completions.create(model="default", prompt="A person as JSON:", max_tokens=64, temperature=0,
                               extra_body={"response_format": {"type": "json_schema",
                                                               "json_schema": {"name": "p", "schema": PERSON}}})
    jsonschema.validate(json.loads(c.choices[0].text), PERSON)


HOSTILE = {"type": "object", "properties": {'a"b': {"type": "integer", "minimum": 0, "maximum": 999},
                                            "c\\d\n\t": {"type": "string", "format": "date"}},
           "required": ['a"b', "c\\d\n\t"], "additionalProperties": False}


def test_property_names_to_escape_and_formats_give_json(oai, client):
    """Names with a quote, a backslash, newline and tab, and a date: the output is JSON of the schema."""
    msgs = [{"role": "user", "content": "Give a count and a date as JSON."}]
    r = oai.chat.completions.create(model="default", messages=msgs, max_tokens=64, temperature=0,
                                    response_format={"type": "json_schema", "json_schema": {
                                        "name": "odd", "schema": HOSTILE, "strict": True}})
    assert r.choices[0].finish_reason == "stop", r.choices[0]
    jsonschema.validate(json.loads(r.choices[0].message.content), HOSTILE, format_checker=jsonschema.FormatChecker())
    g = client.post("/generate", json={"text": "JSON:", "sampling_params": {
        "max_new_tokens": 64, "temperature": 0, "json_schema": json.dumps(HOSTILE)}}).json()
    assert g["meta_info"]["finish_reason"]["type"] == "stop", g
    jsonschema.validate(json.loads(g["text"]), HOSTILE, format_checker=jsonschema.FormatChecker())
    bad = client.post("/generate", json={"text": "JSON:", "sampling_params": {
        "max_new_tokens": 8, "json_schema": json.dumps({"type": "string", "format": "hostname"})}})
    assert bad.status_code == 400 and "string format 'hostname' is not supported" in bad.text


def test_native_regex_and_schema(client):
    r = client.post("/generate", json={"text": "The year:", "sampling_params": {
        "max_new_tokens": 8, "temperature": 0, "regex": "(19|20)[0-9]{2}"}}).json()
    assert re.fullmatch("(19|20)[0-9]{2}", r["text"])
    r = client.post("/generate", json={"text": "JSON:", "sampling_params": {
        "max_new_tokens": 64, "temperature": 0, "json_schema": json.dumps(PERSON)}}).json()
    jsonschema.validate(json.loads(r["text"]), PERSON)
    assert r["meta_info"]["forced_tokens"] > 0


@pytest.mark.parametrize("sp,match", [
    ({"regex": "(a"}, "invalid regex"),
    ({"regex": "a{1000}{1000}"}, "too large"),
    ({"json_schema": json.dumps({"type": "object", "patternProperties": {"a": {}}})}, "patternProperties"),
    ({"json_schema": json.dumps({"$ref": "#/$defs/n",
                                 "$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}})},
     ""),
])
def test_hostile_grammars_answer_400_and_the_server_keeps_serving(client, server, oai, sp, match):
    r = client.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 8, **sp}})
    assert r.status_code == 400 and match in r.json()["error"]["message"], r.text
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="default", prompt="x", max_tokens=4, extra_body=sp)
    ok = client.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 4}})
    assert ok.status_code == 200
    rss = sum(p.memory_info().rss for p in [psutil.Process(server.proc.pid)] +
              psutil.Process(server.proc.pid).children(recursive=True))
    assert rss < 8 << 30  # compiles run in rlimit'd children: no grammar can balloon the server
    assert_idle_and_whole(client)


def test_context_free_grammars_compile_on_a_default_server(client, oai):
    """--grammar-backend auto (the default): ebnf and structural_tag go to a backend that compiles them."""
    from lark import Lark

    from grammars import ARITH_EBNF, ARITH_LARK

    r = client.post("/generate", json={"text": "An arithmetic expression that equals 12:", "sampling_params": {
        "max_new_tokens": 48, "temperature": 0, "ebnf": ARITH_EBNF}})
    assert r.status_code == 200, r.text
    Lark(ARITH_LARK, parser="earley").parse(r.json()["text"])  # raises on text outside the grammar
    assert r.json()["meta_info"]["finish_reason"]["type"] == "stop"
    tag = {"type": "structural_tag", "triggers": ["<f"], "structures": [
        {"begin": "<f>", "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                                    "additionalProperties": False}, "end": "</f>"}]}
    out = oai.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                      temperature=0, response_format=tag)
    assert isinstance(out.choices[0].message.content, str)  # compiled (outlines alone answers 400 naming it)
    assert_idle_and_whole(client)


def test_vllm_structured_outputs_and_include_stop_str(oai, client):
    """vLLM's structured_outputs (json / regex / choice / grammar / json_object) constrain as the native fields do
    (the same greedy text as regex / json_schema / ebnf), on chat and completions; include_stop_str_in_output is
    no_stop_trim; conflicting or unsupported forms answer 400 naming the field."""
    from grammars import ARITH_EBNF

    msgs = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]

    def chat(**extra) -> str:
        return oai.chat.completions.create(model="default", messages=msgs, max_tokens=48, temperature=0,
                                           extra_body=extra).choices[0].message.content

    choices = ["yes!", "no (surely)", "a.b|c"]  # regex metacharacters: each choice is literal
    got = chat(structured_outputs={"choice": choices})
    assert got in choices
    assert got == chat(regex="(?:yes!|no \\(surely\\)|a\\.b\\|c)")
    got = chat(structured_outputs={"json": PERSON})
    jsonschema.validate(json.loads(got), PERSON)
    assert got == chat(json_schema=json.dumps(PERSON))
    assert chat(structured_outputs={"regex": "[0-9]{3}"}) == chat(regex="[0-9]{3}")
    assert re.fullmatch("[0-9]{3}", chat(structured_outputs={"regex": "[0-9]{3}"}))
    assert chat(structured_outputs={"grammar": ARITH_EBNF}) == chat(ebnf=ARITH_EBNF)
    assert isinstance(json.loads(chat(structured_outputs={"json_object": True})), dict)
    text = oai.completions.create(model="default", prompt="Sky color:", max_tokens=5, temperature=0,
                                  extra_body={"structured_outputs": {"choice": ["blue", "red"]}}).choices[0].text
    assert text in ("blue", "red")

    plain = chat(stop=["."])
    kept = chat(stop=["."], include_stop_str_in_output=True)
    assert kept == chat(stop=["."], no_stop_trim=True) == plain + "."
    for bad, named in (({"structured_outputs": {"choice": ["a"], "regex": "b"}}, "exactly one"),
                       ({"structured_outputs": {}}, "exactly one"),
                       ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
                       ({"structured_outputs": {"choice": ["a"], "disable_any_whitespace": True}},
                        "disable_any_whitespace"),
                       ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
                        "not response_format with another"),
                       ({"structured_outputs": {"choice": ["a"]}, "regex": "x"}, "not structured_outputs"),
                       ({"structured_outputs": {"nope": 1}}, "nope"),
                       ({"include_stop_str_in_output": True, "no_stop_trim": False}, "disagree")):
        r = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 4, **bad})
        assert r.status_code == 400 and named in r.json()["error"]["message"], (bad, r.text)
    assert_idle_and_whole(client)
