"""Tool-call parsers: cost per streamed delta (no model). The server's chat streams feed every text
delta of every choice through a parser on the HTTP process's event loop, so the cost per delta must not
grow with what came before (a parser that re-read its whole group each delta would be quadratic).

Reported: microseconds per delta of 4 characters for a plain answer, a hermes call with 5 KB and 50 KB
of arguments, a pythonic call of 6 KB, and the XML / special-token formats with many parameters, many
calls or a long value.

    python benchmarks/bench_tool_parsers.py
"""

from __future__ import annotations

import json
import time

from radixlang_runtime.tool_parsers import get_parser


def per_delta_us(fmt: str, text: str, step: int = 4) -> float:
    parser = get_parser(fmt)()
    t = time.perf_counter()
    n = 0
    for i in range(0, len(text), step):
        parser.feed(text[i:i + step])
        n += 1
    parser.finish()
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    cases = {
        "plain text, 9.6 KB (hermes)": ("hermes", "Some plain answer text. " * 400),
        "hermes call, 5 KB args": ("hermes", "<tool_call>\n" + json.dumps(
            {"name": "f", "arguments": {"text": "word " * 800, "items": list(range(200))}}) + "\n</tool_call>"),
        "hermes call, 50 KB args": ("hermes", "<tool_call>\n" + json.dumps(
            {"name": "f", "arguments": {"text": "word " * 10000}}) + "\n</tool_call>"),
        "pythonic call, 6 KB": ("pythonic", "[f(text=" + repr("word " * 1000) + ", n=["
                                + ", ".join(map(str, range(300))) + "])]"),
        "qwen3_coder, 300 parameters": ("qwen3_coder", "<tool_call>\n<function=f>\n" + "".join(
            f"<parameter=p{i}>\n{i}\n</parameter>\n" for i in range(300)) + "</function>\n</tool_call>"),
        "qwen3_coder, a 50 KB value": ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=text>\n"
                                       + "word " * 10000 + "\n</parameter>\n</function>\n</tool_call>"),
        "glm45, 300 parameters": ("glm45", "<tool_call>f\n" + "".join(
            f"<arg_key>p{i}</arg_key>\n<arg_value>{i}</arg_value>\n" for i in range(300)) + "</tool_call>"),
        "deepseekv3, 100 calls": ("deepseekv3", "<｜tool▁calls▁begin｜>" + "\n".join(
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n" + json.dumps({"a": i})
            + "\n```<｜tool▁call▁end｜>" for i in range(100)) + "<｜tool▁calls▁end｜>"),
        "gpt-oss, 50 KB analysis + call": ("gpt-oss", "<|channel|>analysis<|message|>" + "word " * 10000
                                           + "<|end|><|start|>assistant<|channel|>commentary to=functions.f "
                                           "<|constrain|>json<|message|>" + json.dumps({"text": "word " * 10000})
                                           + "<|call|>"),
    }
    for name, (fmt, text) in cases.items():
        print(f"{name:32s} {per_delta_us(fmt, text):7.1f} us / delta")


if __name__ == "__main__":
    main()
