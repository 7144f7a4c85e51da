"""select against the fake backend with hand-set logprobs: decisions, meta_info and the exact
requests equal a hand computation for all three methods (one character = one token)."""

from __future__ import annotations

import pytest

import radixlang as sgl
from radixlang.backend.fake import FakeBackend
from radixlang.backend.native import choice_entries

# logprob of a character after a context (strings); anything else -2.0
TABLE = {("Say zz", "z"): -0.5, ("Say zzz", "!"): -0.25, ("Say zz", "y"): -0.2, ("Say zzy", "!"): -3.0,
         ("Say zz", "q"): -1.0, ("", "z"): 0.0, ("z", "!"): -0.1, ("y", "!"): -2.5}


def table_logprob(context: list, token: int) -> float:
    return TABLE.get(("".join(map(chr, context)), chr(token)), -2.0)


def run_select(backend, prompt, choices, method):
    @sgl.function
    def prog(s):
        s += prompt
        s += sgl.select("pick", choices=choices, choices_method=method)

    return prog.run(backend=backend)


def entry(lp, ch):
    return [lp, ord(ch), ch]


def test_token_length_normalized_by_hand():
    fake = FakeBackend(logprob=table_logprob)
    st = run_select(fake, "Say zz", ["z!", "y!", "q"], sgl.token_length_normalized)
    # the prompt's last two tokens are equal ("zz"): the choice "z!" still scores exactly its own two tokens
    want_inputs = [[entry(-0.5, "z"), entry(-0.25, "!")], [entry(-0.2, "y"), entry(-3.0, "!")], [entry(-1.0, "q")]]
    want_scores = [-0.375, -1.6, -1.0]
    meta = st.get_meta_info("pick")
    assert meta["input_token_logprobs"] == want_inputs
    assert meta["normalized_prompt_logprobs"] == pytest.approx(want_scores)
    assert meta["output_token_logprobs"] == [[], [], []]
    assert st["pick"] == "z!" and st.text() == "Say zzz!"
    assert fake.requests == [
        {"text": "Say zz", "sampling_params": {"max_new_tokens": 0}},
        {"text": ["Say zz", "Say zzz!", "Say zzy!", "Say zzq"],
         "sampling_params": {"max_new_tokens": 0, "temperature": 0}, "return_logprob": True,
         "return_text_in_logprobs": True, "logprob_start_len": 4},
    ]


def test_greedy_token_selection_by_hand():
    fake = FakeBackend(logprob=table_logprob)
    st = run_select(fake, "Say zz", ["z!", "y!", "q"], sgl.greedy_token_selection)
    # position 0: y (-0.2) beats z (-0.5) and q (-1.0)
    assert st["pick"] == "y!"
    assert st.get_meta_info("pick")["greedy_logprob_matrix"] == [[-0.5, -0.25], [-0.2, -3.0], [-1.0, -1.0]]


def test_greedy_ties_go_on_to_the_next_token():
    table = {("P: ", "a"): -1.0, ("P: a", "b"): -2.0, ("P: a", "c"): -0.5}
    fake = FakeBackend(logprob=lambda ctx, t: table.get(("".join(map(chr, ctx)), chr(t)), -9.0))
    st = run_select(fake, "P: ", ["ab", "ac", "a"], sgl.greedy_token_selection)
    # "a" alone is padded with its mean (-1.0): position 1 has -2.0, -0.5, -1.0
    assert st["pick"] == "ac"
    assert st.get_meta_info("pick")["greedy_logprob_matrix"] == [[-1.0, -2.0], [-1.0, -0.5], [-1.0, -1.0]]


def test_unconditional_likelihood_normalized_by_hand():
    fake = FakeBackend(logprob=table_logprob)
    st = run_select(fake, "Say zz", ["z!", "y!"], sgl.unconditional_likelihood_normalized)
    meta = st.get_meta_info("pick")
    # unconditional: "z!" -> [None→0, -0.1], "y!" -> [None→0, -2.5]
    assert meta["unconditional_token_logprobs"] == [[[None, ord("z"), None], [-0.1, ord("!"), None]],
                                                    [[None, ord("y"), None], [-2.5, ord("!"), None]]]
    want = [((-0.5 - 0) + (-0.25 + 0.1)) / 2, ((-0.2 - 0) + (-3.0 + 2.5)) / 2]
    assert meta["normalized_unconditional_prompt_logprobs"] == pytest.approx(want)
    assert st["pick"] == "z!"
    assert fake.requests[2] == {"input_ids": [[ord("z"), ord("!")], [ord("y"), ord("!")]],
                                "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                                "logprob_start_len": 0}


def test_ties_pick_the_first_choice_and_short_prompts_work():
    fake = FakeBackend(logprob=lambda ctx, t: -1.0)
    st = run_select(fake, "A", ["x", "y"], sgl.token_length_normalized)
    assert st["pick"] == "x"
    assert fake.requests[1]["logprob_start_len"] == 0  # P = 1: from the first position, token 0 has no logprob


def test_select_on_an_empty_prompt_scores_choices_alone():
    fake = FakeBackend(logprob=lambda ctx, t: -0.1 if chr(t) == "b" else -1.0)
    st = run_select(fake, "", ["ab", "ac"], sgl.token_length_normalized)
    assert st["pick"] == "ab" and fake.requests[0]["text"] == ["ab", "ac"]


def test_choice_entries_keep_a_healed_boundary_token():
    prompt = [[-0.5, 10, "A"]]  # the bare prompt's last token
    healed = [[-0.7, 11, "AB"], [-0.2, 12, "C"]]  # prompt + choice tokenized across the boundary
    assert choice_entries(prompt, healed) == healed
    plain = [[-0.5, 10, "A"], [-0.2, 12, "C"]]
    assert choice_entries(prompt, plain) == [[-0.2, 12, "C"]]


def test_gen_with_choices_is_a_select():
    fake = FakeBackend(logprob=table_logprob)

    @sgl.function
    def prog(s):
        s += "Say zz" + sgl.gen("pick", choices=["z!", "q"])

    assert prog.run(backend=fake)["pick"] == "z!"


def test_select_with_temperature_samples_among_choices():
    fake = FakeBackend(logprob=table_logprob)

    @sgl.function
    def prog(s):
        s += "Say zz" + sgl.select("pick", choices=["z!", "y!", "q"], temperature=100.0)

    picks = {prog.run(backend=fake)["pick"] for _ in range(40)}
    assert picks <= {"z!", "y!", "q"} and len(picks) >= 2


def test_bad_choices_are_refused_at_once():
    with pytest.raises(ValueError):
        sgl.select("x", choices=[])
    with pytest.raises(ValueError):
        sgl.select("x", choices=["a", ""])
