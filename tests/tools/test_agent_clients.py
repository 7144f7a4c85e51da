"""Real agent frameworks against ONE real server on the embedded model, no tool-specific flag:
langchain-openai (bind_tools + a tool loop), the OpenAI Agents SDK (Agent + function_tool through
OpenAIChatCompletionsModel), instructor (TOOLS and JSON_SCHEMA modes). The 135M model does not call tools
unprompted, so each loop's first turn forces the call (tool_choice required / named); the next turn
answers in text. Every request body a client sends is recorded (httpx2 event hooks on its own client)
to check that the tool result went back to the server as a `role: "tool"` message."""

from __future__ import annotations

import json

import httpx2
import jsonschema
import pytest
from pydantic import BaseModel, Field

from server_utils import ServerProcess

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
ASK = "What is the weather in London?"


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--max-total-tokens", "8192")
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


class Recorder:
    """The JSON bodies of the chat requests a client sent, in order."""

    def __init__(self):
        self.bodies: list[dict] = []

    def hook(self, request) -> None:
        if request.url.path.endswith("/chat/completions"):
            self.bodies.append(json.loads(request.read()))

    async def ahook(self, request) -> None:
        self.hook(request)

    def tool_messages(self, k: int) -> list[dict]:
        return [m for m in self.bodies[k]["messages"] if m["role"] == "tool"]


def test_langchain_tool_loop(server):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    calls = []

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return f"12 C and light rain in {city}"

    rec = Recorder()
    llm = ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model="default", temperature=0, max_tokens=60,
                     http_client=httpx2.Client(event_hooks={"request": [rec.hook]}, timeout=120))
    messages = [HumanMessage(ASK)]
    ai = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(messages)
    assert len(ai.tool_calls) == 1 and ai.tool_calls[0]["name"] == "get_weather"
    jsonschema.validate(ai.tool_calls[0]["args"], get_weather.args_schema.model_json_schema())
    messages += [ai, ToolMessage(get_weather.invoke(ai.tool_calls[0]["args"]), tool_call_id=ai.tool_calls[0]["id"])]
    final = llm.bind_tools([get_weather]).invoke(messages)  # tool_choice auto: the model answers in text
    assert final.tool_calls == [] and isinstance(final.content, str) and final.content
    assert calls == [ai.tool_calls[0]["args"]["city"]]
    assert rec.bodies[0]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    sent = rec.tool_messages(1)
    assert [(m["tool_call_id"], m["content"]) for m in sent] == [(ai.tool_calls[0]["id"], f"12 C and light rain in "
                                                                  f"{calls[0]}")]


def test_openai_agents_sdk_run(server):
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return f"12 C and light rain in {city}"

    rec = Recorder()
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="unused",
                         http_client=httpx2.AsyncClient(event_hooks={"request": [rec.ahook]}, timeout=120))
    agent = Agent(name="weather", instructions="Answer questions about the weather.", tools=[get_weather],
                  model=OpenAIChatCompletionsModel(model="default", openai_client=client),
                  model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=60))
    result = Runner.run_sync(agent, ASK, max_turns=3)
    # turn 1: the forced call; the SDK runs the tool and (reset_tool_choice) lets turn 2 answer freely
    assert len(calls) == 1 and len(rec.bodies) == 2
    assert rec.bodies[0]["tool_choice"] == "required" and rec.bodies[1].get("tool_choice") in (None, "auto")
    jsonschema.validate({"city": calls[0]}, get_weather.params_json_schema)
    assert [m["content"] for m in rec.tool_messages(1)] == [f"12 C and light rain in {calls[0]}"]
    assert isinstance(result.final_output, str) and result.final_output


def test_the_agents_sdk_example_calls_the_tool_for_the_asked_city(server):
    """examples/agents_sdk_weather.py against this module's server: the enum-typed tool argument makes the
    forced call name the question's city (the example's own check), and the answer is text."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                        "agents_sdk_weather.py")
    spec = importlib.util.spec_from_file_location("agents_sdk_weather", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    for city in ("Paris", "Tokyo"):
        out = example.run(server.url, f"What is the weather in {city}?")
        example.check(out, city)  # SystemExit naming what went wrong otherwise


class Weather(BaseModel):
    city: str = Field(max_length=20)
    celsius: int


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_structured_output(server, mode):
    import instructor
    from openai import OpenAI

    rec = Recorder()
    client = instructor.from_openai(
        OpenAI(base_url=server.url + "/v1", api_key="unused",
               http_client=httpx2.Client(event_hooks={"request": [rec.hook]}, timeout=120)),
        mode=getattr(instructor.Mode, mode))
    w = client.chat.completions.create(model="default", response_model=Weather, max_retries=0, temperature=0,
                                       max_tokens=60, messages=[{"role": "user", "content": ASK}])
    assert isinstance(w, Weather) and isinstance(w.celsius, int)
    body = rec.bodies[0]
    if mode == "TOOLS":  # a named tool_choice: the server constrains the output to that call
        assert body["tool_choice"] == {"type": "function", "function": {"name": "Weather"}}
    else:
        assert body["response_format"]["type"] == "json_schema"
