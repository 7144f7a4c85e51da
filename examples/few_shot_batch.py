"""A few-shot pipeline over a shared prefix with run_batch: the constant examples are traced out of
the program and pre-filled once, then every question reuses them from the radix cache."""

from __future__ import annotations

from _common import run_example, sgl

SHOTS = [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
         ("Japan", "Tokyo"), ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Kenya", "Nairobi")]
PREFIX = "".join(f"Q: What is the capital of {c}?\nA: {a}\n" for c, a in SHOTS)


@sgl.function
def capital(s, country):
    s += PREFIX
    s += "Q: What is the capital of " + country + "?\nA:" + sgl.gen("answer", stop="\n", max_tokens=8)


def main(backend, countries=("Peru", "Norway", "India", "Chile")):
    states = capital.run_batch([{"country": c} for c in countries], backend=backend, temperature=0)
    assert len(states) == len(countries)
    for c, st in zip(countries, states):
        assert st.text().startswith(PREFIX + f"Q: What is the capital of {c}?"), "input order lost"
        meta = st.get_meta_info("answer")
        print(f"{c:8s} -> {st['answer'].strip()!r:16s} cached {meta['cached_tokens']}/{meta['prompt_tokens']} tokens")
    return states


if __name__ == "__main__":
    run_example(main, __doc__)
