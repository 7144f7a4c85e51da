"""Classification with `select`: every label is scored in one batched request over the cached few-shot
prompt, and the decision comes with its scores. The few-shot examples carry the small model: each review
below gets the label a reader would give it."""

from __future__ import annotations

from _common import run_example, sgl

LABELS = ["positive", "negative"]
SHOTS = [("I loved every minute of it.", "positive"), ("Waste of money, it broke in a day.", "negative"),
         ("Great value and friendly people.", "positive"), ("Terrible service, never again.", "negative")]
REVIEWS = {"The food was cold and the staff were rude.": "negative",
           "Absolutely wonderful, I will come back!": "positive",
           "I hate it.": "negative",
           "Best purchase I have made this year.": "positive"}


@sgl.function
def sentiment(s, review):
    s += "Classify the sentiment of each review as positive or negative.\n\n"
    for text, label in SHOTS:
        s += f"Review: {text}\nSentiment: {label}\n"
    s += "Review: " + review + "\nSentiment: " + sgl.select("label", LABELS)


def main(backend):
    states = sentiment.run_batch([{"review": r} for r in REVIEWS], backend=backend)
    for (review, expected), st in zip(REVIEWS.items(), states):
        scores = st.get_meta_info("label")["normalized_prompt_logprobs"]
        print(f"{st['label']:9s} {[round(x, 2) for x in scores]}  {review}")
        assert len(scores) == len(LABELS)
        assert st["label"] == expected, (review, st["label"], scores)
    return states


if __name__ == "__main__":
    run_example(main, __doc__)
