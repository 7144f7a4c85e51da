"""An agent written with the OpenAI Agents SDK (`pip install openai-agents`) the default way: a default client
pointed at radixlang and the SDK's default Responses API (/v1/responses, docs/RESPONSES_API.md).

    python examples/agents_sdk_weather.py                       # starts its own server (embedded SmolLM2-135M)
    python examples/agents_sdk_weather.py --url http://host:p   # a running launch_server

The tool's argument is a `Literal` of the cities it knows, so its JSON schema is an enum and the server's
grammar (tool_choice "required" on the first turn) makes even the 135M model call it with a real city; the
SDK runs the tool, sends the result back as a `function_call_output` item, and the model answers in text. The
example checks its own outcome: one call, for the city in the question, and a non-empty answer.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Literal

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # runnable from a checkout

WEATHER = {"London": "12 C and light rain", "Paris": "17 C and sunny", "Tokyo": "22 C and humid"}


def run(base_url: str, question: str = "What is the weather in Paris?") -> dict:
    """One agent run against the server at base_url; returns the tool calls and the final answer."""
    from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no trace upload: the run stays on this machine
    calls: list[str] = []

    @function_tool
    def get_weather(city: Literal["London", "Paris", "Tokyo"]) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return f"{WEATHER[city]} in {city}"

    set_default_openai_client(AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1",
                                          api_key=os.environ.get("RADIXLANG_API_KEY", "none"), timeout=120))
    agent = Agent(name="weather", instructions="Answer questions about the weather in one sentence.",
                  tools=[get_weather], model="default",  # the served model (or its name)
                  model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=48))
    result = Runner.run_sync(agent, question, max_turns=3)
    return {"calls": calls, "answer": result.final_output}


def check(out: dict, city: str) -> None:
    if out["calls"] != [city]:
        raise SystemExit(f"expected one get_weather call for {city}, got {out['calls']}")
    if not isinstance(out["answer"], str) or not out["answer"].strip():
        raise SystemExit(f"expected a text answer, got {out['answer']!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server's http://host:port; default: start one")
    args = parser.parse_args()
    if args.url:
        out = run(args.url)
    else:
        import radixlang as sgl

        with sgl.Runtime(max_total_tokens=8192) as rt:
            out = run(rt.url)
    print(f"tool calls: {out['calls']}\nanswer: {out['answer']}")
    check(out, "Paris")


if __name__ == "__main__":
    main()
