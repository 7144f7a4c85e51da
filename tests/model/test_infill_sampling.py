"""llama.cpp's infill stage (model/executor/infill_sampling.py) against a plain reference written from llama.cpp's
llama_sampler_infill_apply, on hand-built candidates and piece tables; then inside the Sampler: rows without it
unchanged, the rows with it ending, merging and drawing from what it keeps."""

from __future__ import annotations

import random

import pytest
import torch

from radixlang_runtime.model.executor.infill_sampling import InfillStage, infill_filter
from radixlang_runtime.model.executor.sampler import Sampler
from radixlang_runtime.model.executor.step_io import SampleSpec
from radixlang_runtime.protocol.limits import FieldError
from radixlang_runtime.protocol.sampling_params import SamplingParams


def reference(cands: list[tuple[int, float]], pieces: dict[int, bytes], eog: set[int]):
    """llama.cpp's steps one by one over (id, p) sorted by p: None where it reduces the row to its EOT token,
    else the ids kept."""
    toks = [[t, p / sum(q for _, q in cands), False] for t, p in cands]  # id, p, merged away
    n = len(toks)
    p_eog = sum(p for t, p, _ in toks if t in eog)
    p_txt = sum(p for t, p, _ in toks if t not in eog)
    if 3 * p_eog * n > p_txt:
        return [t for t, _, _ in toks if t in eog]
    for i0 in range(n):
        for i1 in range(n):
            if toks[i0][2]:
                break
            if i0 == i1 or toks[i1][2]:
                continue
            s0 = b"" if toks[i0][0] in eog else pieces.get(toks[i0][0], b"")
            s1 = b"" if toks[i1][0] in eog else pieces.get(toks[i1][0], b"")
            if len(s0) > 0 and len(s0) <= len(s1) and s1[:len(s0)] == s0:
                dst, src = (i1, i0) if toks[i1][1] > toks[i0][1] else (i0, i1)
                toks[dst][1] += toks[src][1]
                toks[src][1] = 0.0
                toks[src][2] = True
    kept = [x for x in toks if x[1] >= 0.2 or x[0] in eog]
    n_txt = sum(1 for x in kept if x[0] not in eog)
    if n_txt == 0:
        return None
    total = sum(x[1] for x in kept)
    kept = [[t, p / total, m] for t, p, m in kept]
    return [t for t, p, _ in kept if p >= 1.0 / (n_txt + 1) or t in eog]


def run(cands, pieces, eog):
    return infill_filter([t for t, _ in cands], [p for _, p in cands], lambda t: pieces.get(t, b""), eog.__contains__)


MERGE = {1: b"x", 2: b"re", 3: b"return", 4: b"ret", 5: b"a", 6: b"b", 9: b""}
CASES = {
    "end tokens weigh enough": ([(1, 0.5), (2, 0.3), (9, 0.2)], {9}, [9]),
    "end tokens too light": ([(1, 0.6), (2, 0.399), (9, 0.001)], {9}, [1, 2, 9]),
    "prefixes merge into the likelier": ([(1, 0.45), (2, 0.15), (3, 0.12), (4, 0.10), (5, 0.09), (6, 0.09)], set(),
                                         [1, 2]),
    "the longer token takes the prefix's": ([(3, 0.5), (5, 0.3), (2, 0.2)], set(), [3]),  # a: 0.3 < 1 / 3
    "second floor drops the third": ([(5, 0.5), (6, 0.3), (1, 0.2)], set(), [5, 6]),
    "nothing reaches a fifth": ([(t, 0.1) for t in range(10, 20)], set(), None),
    "an end token alone is not text": ([(1, 0.17), (5, 0.17), (6, 0.166), (10, 0.166), (11, 0.166), (12, 0.161),
                                        (9, 0.001)], {9}, None),
}


@pytest.mark.parametrize("name", CASES)
def test_hand_built_cases_match_the_reference(name):
    cands, eog, want = CASES[name]
    assert reference(cands, MERGE, eog) == want
    assert run(cands, MERGE, eog) == want


def test_merging_decides_what_stays():
    """Without the pieces nothing merges and only "x" reaches a fifth; with them "re" gathers its extensions."""
    cands = CASES["prefixes merge into the likelier"][0]
    assert run(cands, {}, set()) == [1]
    assert run(cands, MERGE, set()) == [1, 2]


def test_random_cases_match_the_reference():
    rng = random.Random(7)
    alphabet = [b"", b"a", b"b", b"ab", b"ba", b"aa", b"abc", b"b", b"abcd", b"c"]
    for _ in range(2000):
        n = rng.randint(1, 12)
        ids = rng.sample(range(40), n)
        pieces = {t: rng.choice(alphabet) for t in ids}
        eog = {t for t in ids if rng.random() < 0.1}
        ps = sorted((rng.random() ** 3 + 1e-6 for _ in ids), reverse=True)
        cands = list(zip(ids, ps))
        assert run(cands, pieces, eog) == reference(cands, pieces, eog), (cands, pieces, eog)


# ------------------------------------------------------------------ inside the Sampler
V, EOS = 8, 7
PIECES = [b"x", b"re", b"return", b"ret", b"a", b"b", b"zz", None]


def spec(**sp) -> SampleSpec:
    return SampleSpec(SamplingParams.from_dict(sp), input_ids=[1, 2], output_ids=[])


def sampler(pieces=PIECES, seed=0) -> Sampler:
    s = Sampler(V, [EOS], torch.device("cpu"), seed)
    s.infill = InfillStage(lambda: pieces)
    return s


def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor([float("-inf") if p == 0 else torch.log(torch.tensor(p)).item() for p in probs])


def draws(s: Sampler, probs: list[float], reqs: list[SampleSpec], rounds: int = 1) -> list[int]:
    out = []
    for _ in range(rounds):
        out += s.sample(logits_of(probs).repeat(len(reqs), 1), reqs)
    return out


def test_rows_without_infill_are_unchanged():
    """A seeded row draws the same tokens beside infill rows as beside plain ones, and a batch without infill
    never reaches the stage."""
    probs = [0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05]
    for seed in range(30):
        plain = spec(top_k=8, sampling_seed=seed)
        alone = draws(sampler(), probs, [plain, spec(top_k=8)])[0]
        beside = draws(sampler(), probs, [plain, spec(top_k=8, infill=True)])[0]
        assert alone == beside
    s = sampler()

    def refuse(*a, **k):
        raise AssertionError("the infill stage ran on a batch without infill rows")

    s.infill.apply = refuse
    assert len(draws(s, probs, [spec(top_k=8), spec(top_k=4, top_p=0.9), spec(temperature=0.0)])) == 3
    with pytest.raises(AssertionError):
        draws(s, probs, [spec(top_k=8, infill=True)])


def test_a_likely_enough_end_token_ends_the_row():
    probs = [0.5, 0.2, 0.1, 0.1, 0.04, 0.0, 0.0, 0.06]  # EOS at 0.06 of six candidates: 3 * 0.06 * 6 > 0.94
    assert set(draws(sampler(), probs, [spec(top_k=8, infill=True)] * 50)) == {EOS}
    assert len(set(draws(sampler(), probs, [spec(top_k=8)] * 50)) - {EOS}) > 2
    probs = [0.5, 0.2, 0.1, 0.1, 0.06, 0.0, 0.0, 0.04]  # EOS at 0.04: 3 * 0.04 * 6 < 0.96, the text goes on
    got = draws(sampler(), probs, [spec(top_k=8, infill=True)] * 400)  # x, re (with return, ret) and EOS stay
    assert set(got) == {0, 1, EOS} and got.count(EOS) < 60


def test_no_text_token_left_takes_the_end_token():
    probs = [0.15, 0.15, 0.14, 0.14, 0.14, 0.14, 0.14, 0.0]  # EOS impossible, every text token under a fifth
    assert set(draws(sampler(pieces=[]), probs, [spec(top_k=8, infill=True)] * 40)) == {EOS}
    assert set(draws(sampler(), probs, [spec(top_k=8, infill=True)] * 40)) == {1}  # re gathers return and ret
    assert EOS not in draws(sampler(), probs, [spec(top_k=8)] * 40)
    assert EOS not in draws(sampler(pieces=[]), probs, [spec(top_k=8, infill=True, min_new_tokens=1)] * 40)


def test_kept_tokens_are_drawn_with_their_own_probabilities():
    """x (0.45) and re (0.15, which gathers return and ret) stay; the draw is 3 : 1, not x against re's sum."""
    probs = [0.45, 0.15, 0.12, 0.10, 0.09, 0.09, 0.0, 0.0]
    got = draws(sampler(), probs, [spec(top_k=8, infill=True)] * 1000, rounds=4)
    assert set(got) == {0, 1}
    assert abs(got.count(1) / len(got) - 0.25) < 0.03
    assert set(draws(sampler(pieces=[]), probs, [spec(top_k=8, infill=True)] * 200)) == {0}  # nothing merges


def test_top_k_bounds_the_candidates_and_greedy_rows_take_the_argmax():
    probs = [0.45, 0.15, 0.12, 0.10, 0.09, 0.09, 0.0, 0.0]
    assert set(draws(sampler(), probs, [spec(top_k=2, infill=True)] * 200)) == {0}  # "return", "ret" left out
    assert set(draws(sampler(), [0.3, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1],
                     [spec(temperature=0.0, top_k=8, infill=True)] * 20)) == {0}


def test_the_piece_table_is_built_once_on_the_first_infill_row():
    built = []
    s = Sampler(V, [EOS], torch.device("cpu"), 0)
    s.infill = InfillStage(lambda: built.append(1) or PIECES)
    probs = [0.45, 0.15, 0.12, 0.10, 0.09, 0.09, 0.0, 0.0]
    draws(s, probs, [spec(top_k=8)] * 4)
    assert built == []
    draws(s, probs, [spec(top_k=8, infill=True)] * 4, rounds=3)
    assert built == [1]


def test_infill_params():
    assert SamplingParams.from_wire(SamplingParams.from_dict({"infill": True, "top_k": 40}).to_wire()).infill
    for bad, param in (({"infill": True}, "top_k"), ({"infill": True, "top_k": 5000}, "top_k"),
                       ({"infill": "yes", "top_k": 4}, "infill")):
        with pytest.raises(FieldError) as e:
            SamplingParams.from_dict(bad)
        assert e.value.param == param
