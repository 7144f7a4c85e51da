"""A ReAct-style agent with a calculator tool: the model picks an action with `select`, writes the
tool input with `gen`, and the program runs the tool and feeds the observation back."""

from __future__ import annotations

import re

from _common import run_example, sgl

EXAMPLE = """Answer questions with a calculator.
Question: What is 12 times 7?
Thought: I need to multiply 12 by 7.
Action: Calculate [12*7]
Observation: 84
Thought: I know the answer.
Action: Finish [84]
"""


def calculator(expression: str) -> str:
    """Digits, spaces, + - * / ( ) and dots only; anything else is an error message, never evaluated."""
    if not re.fullmatch(r"[0-9+\-*/(). ]+", expression.strip() or "x"):
        return f"error: cannot calculate {expression!r}"
    try:
        return str(eval(expression, {"__builtins__": {}}))  # the pattern above admits arithmetic only
    except (SyntaxError, ZeroDivisionError, TypeError) as e:
        return f"error: {e}"


@sgl.function
def agent(s, question, max_steps=3):
    s += EXAMPLE + "Question: " + question + "\n"
    for step in range(max_steps):
        s += "Thought:" + sgl.gen(f"thought_{step}", stop="\n", max_tokens=16) + "\n"
        s += "Action: " + sgl.select(f"action_{step}", ["Calculate", "Finish"])
        s += " [" + sgl.gen(f"input_{step}", stop="]", max_tokens=12) + "]\n"
        if s[f"action_{step}"] == "Finish":
            s["answer"] = s[f"input_{step}"]
            return
        s += "Observation: " + calculator(s[f"input_{step}"]) + "\n"
    s["answer"] = None


def main(backend):
    st = agent.run(question="What is 23 times 19?", backend=backend, temperature=0)
    steps = [k for k in range(3) if f"action_{k}" in st]
    assert steps and all(st[f"action_{k}"] in ("Calculate", "Finish") for k in steps), st.text()
    for k in steps:
        if st[f"action_{k}"] == "Calculate":
            assert f"Observation: {calculator(st[f'input_{k}'])}\n" in st.text()
    print(st.text()[len(EXAMPLE):])
    print("answer:", st["answer"])
    return st


if __name__ == "__main__":
    run_example(main, __doc__)
