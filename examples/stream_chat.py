"""Streaming to the terminal: `run(stream=True)` returns at once and `text_iter` yields the answer
as the tokens arrive."""

from __future__ import annotations

import sys

from _common import run_example, sgl


@sgl.function
def chat(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=48))


def main(backend, out=sys.stdout):
    st = chat.run(question="Describe the sea in two sentences.", backend=backend, stream=True, temperature=0)
    pieces = []
    for piece in st.text_iter("answer"):
        pieces.append(piece)
        out.write(piece)
        out.flush()
    out.write("\n")
    assert "".join(pieces) == st["answer"] and st.error() is None
    return st


if __name__ == "__main__":
    run_example(main, __doc__)
