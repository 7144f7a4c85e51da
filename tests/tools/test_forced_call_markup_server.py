"""A forced tool call written in a format's own markup by the real tokenizer: DeepSeek V3's full-width bars and
```json fences come out of the forced-call regex on the embedded model, and the stream sends the same call."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow  # one server (the embedded model) with a new format's parser
def test_a_forced_call_in_the_deepseekv3_format_on_the_embedded_model():
    """The forced-call regex writes DeepSeek V3's markup (full-width bars, ```json fences) through the real
    tokenizer; the reply's call validates and the stream sends the same call."""
    import httpx
    import jsonschema

    from server_utils import shared_server

    srv = shared_server("--tool-call-parser", "deepseekv3")
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}
    body = {"model": "default", "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [tool], "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0,
            "max_tokens": 400}
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), tool["function"]["parameters"])
        streamed = ["", ""]
        with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    for d in json.loads(line[6:])["choices"][0]["delta"].get("tool_calls") or []:
                        streamed[0] += d["function"].get("name") or ""
                        streamed[1] += d["function"].get("arguments") or ""
    assert streamed == [call["function"]["name"], call["function"]["arguments"]]
