"""Parallel fork: write a short list of tips, then expand every tip in its own fork (the shared
prompt is committed once; the forks decode together) and join the expansions back."""

from __future__ import annotations

from _common import run_example, sgl

N = 3


@sgl.function
def tips(s, topic):
    s += sgl.system("You are a concise assistant.")
    with s.user():
        s += f"Give {N} short tips for {topic}, one per line."
    with s.assistant():
        for i in range(1, N + 1):
            s += f"{i}." + sgl.gen(f"tip_{i}", stop="\n", max_tokens=12) + "\n"
    forks = s.fork(N)
    for i, f in enumerate(forks, start=1):
        f += sgl.user(f"Why does this tip help? Answer in one sentence: {s[f'tip_{i}'].strip()}")
        f += sgl.assistant("It helps because" + sgl.gen("detail", max_tokens=24, stop=["\n", "."]) + ".")
    forks.join()


def main(backend):
    st = tips.run(topic="staying focused", backend=backend, temperature=0)
    details = [d.strip() for d in st["detail"]]
    tip_texts = [st[f"tip_{i}"].strip() for i in range(1, N + 1)]
    for i, (tip, d) in enumerate(zip(tip_texts, details), start=1):
        print(f"{i}. {tip}\n   It helps because {d}.")
    assert len(details) == N and all(details), details
    assert not any(d.lstrip().startswith(("1.", "2.", "3.")) for d in details), "an explanation, not the list again"
    return st


if __name__ == "__main__":
    run_example(main, __doc__)
