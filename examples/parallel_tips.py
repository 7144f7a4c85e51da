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
            s += f"{i}." + sgl.gen(f"tip_{i}", stop="\n", max_tokens=10) + "\n"
    forks = s.fork(N)
    for i, f in enumerate(forks, start=1):
        f += sgl.user(f"Explain tip {i} in one sentence.")
        f += sgl.assistant(sgl.gen("detail", max_tokens=16))
    forks.join()


def main(backend):
    st = tips.run(topic="staying focused", backend=backend, temperature=0)
    details = st["detail"]
    assert isinstance(details, list) and len(details) == N and all(isinstance(d, str) for d in details)
    for i, d in enumerate(details, start=1):
        print(f"{i}.{st[f'tip_{i}']}\n   {d.strip()}")
    return st


if __name__ == "__main__":
    run_example(main, __doc__)
