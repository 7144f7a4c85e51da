"""Classification with `select`: every label is scored in one batched request over the cached
prompt, and the decision comes with its scores."""

from __future__ import annotations

from _common import run_example, sgl

LABELS = ["positive", "negative", "neutral"]


@sgl.function
def sentiment(s, review):
    s += "Classify the sentiment of each review as positive, negative or neutral.\n\n"
    s += "Review: I loved every minute of it.\nSentiment: positive\n"
    s += "Review: Waste of money, it broke in a day.\nSentiment: negative\n"
    s += "Review: " + review + "\nSentiment: " + sgl.select("label", LABELS)


def main(backend):
    reviews = ["The food was cold and the staff were rude.", "Absolutely wonderful, I will come back!",
               "It arrived on Tuesday."]
    states = sentiment.run_batch([{"review": r} for r in reviews], backend=backend)
    for r, st in zip(reviews, states):
        assert st["label"] in LABELS, st.text()
        scores = st.get_meta_info("label")["normalized_prompt_logprobs"]
        assert len(scores) == len(LABELS)
        print(f"{st['label']:9s} {[round(x, 2) for x in scores]}  {r}")
    return states


if __name__ == "__main__":
    run_example(main, __doc__)
