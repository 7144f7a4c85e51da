"""An agent loop with tools: the model is given a weather lookup (a city and a unit from an enum) as a Python
function, calls it through `gen(tools=...)` (the call forced with tool_choice "required"), the program runs
the tool and feeds the result back, and the model answers in text (tool_choice "auto")."""

from __future__ import annotations

from typing import Literal

from _common import run_example, sgl

TEMPERATURES_C = {"paris": 18, "oslo": 4, "cairo": 31}


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Get the current temperature in a city.

    Args:
        city: the city's name, e.g. Paris
        unit: the temperature unit
    """
    c = TEMPERATURES_C.get(city.strip().lower())
    if c is None:
        return f"no weather data for {city}"
    return f"{c} degrees celsius" if unit == "celsius" else f"{round(c * 9 / 5 + 32)} degrees fahrenheit"


TOOLS = {"get_weather": get_weather}


@sgl.function
def agent(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("call", tools=[get_weather], tool_choice="required", max_tokens=64))
    results = [TOOLS[c.name](**c.arguments) for c in s.tool_calls("call")]  # the program runs the tool
    s += sgl.user("<tool_response>\n" + "\n".join(results) + "\n</tool_response>")
    s += sgl.assistant(sgl.gen("answer", tools=[get_weather], tool_choice="auto", max_tokens=48))


def main(backend):
    st = agent.run(question="What is the weather in Paris right now?", backend=backend, temperature=0)
    calls = st.tool_calls("call")
    assert calls and all(isinstance(c, sgl.ToolCall) and c.name == "get_weather" for c in calls), st.text()
    assert st["call"] is calls[0]
    assert set(calls[0].arguments) <= {"city", "unit"} and isinstance(calls[0].arguments["city"], str)
    assert calls[0].arguments.get("unit", "celsius") in ("celsius", "fahrenheit")
    assert "<tool_response>\n" + get_weather(**calls[0].arguments) in st.text()
    answer = st["answer"]  # after the tool's result the model answers in text, reporting the temperature
    assert isinstance(answer, str) and st.tool_calls("answer") == [], st.text()
    assert get_weather(**calls[0].arguments).split()[0] in answer, st.text()
    print(st.text())
    print("call:", calls[0])
    print("answer:", answer)
    return st


if __name__ == "__main__":
    run_example(main, __doc__)
