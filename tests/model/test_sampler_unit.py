"""Sampler on synthetic logits: each parameter's effect, without a model."""

from __future__ import annotations

import math

import pytest
import torch

from radixlang_runtime.model.executor.sampler import Sampler
from radixlang_runtime.model.executor.step_io import SampleSpec
from radixlang_runtime.protocol.sampling_params import SamplingParams

V = 8
EOS = 7


def mk(n=1, prompt=(1, 2), out=(), **sp) -> list[SampleSpec]:
    return [SampleSpec(SamplingParams.from_dict(sp), input_ids=list(prompt), output_ids=list(out)) for i in range(n)]


def sampler(seed=0) -> Sampler:
    return Sampler(V, [EOS], torch.device("cpu"), seed)


LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -2.0, -3.0, 1.5])


def draws(reqs, n_rounds=1, seed=0) -> list[int]:
    s = sampler(seed)
    out = []
    for _ in range(n_rounds):
        out += s.sample(LOGITS.repeat(len(reqs), 1).clone(), reqs)
    return out


def test_greedy_and_top_k_1_take_the_argmax():
    assert set(draws(mk(50, temperature=0.0))) == {0}
    assert set(draws(mk(200, temperature=1.5, top_k=1))) == {0}


def test_temperature_sampling_follows_softmax():
    got = draws(mk(4000, temperature=1.0))
    probs = torch.softmax(LOGITS, -1)
    for tok in range(V):
        freq = got.count(tok) / len(got)
        sd = math.sqrt(probs[tok].item() * (1 - probs[tok].item()) / len(got))
        assert abs(freq - probs[tok].item()) < 5 * sd + 1e-3, tok


def test_top_k_top_p_min_p_restrict_the_support():
    assert set(draws(mk(2000, temperature=1.0, top_k=2))) == {0, 7}
    p = torch.softmax(LOGITS, -1)
    # nucleus: the smallest prefix of the sorted distribution with mass >= top_p
    assert set(draws(mk(2000, temperature=1.0, top_p=0.5))) == {0, 7}
    assert p[0] < 0.5 < p[0] + p[7]
    keep = {i for i in range(V) if p[i] >= 0.2 * p.max()}
    assert set(draws(mk(3000, temperature=1.0, min_p=0.2))) == keep


def _seeded_run(sampler_seed: int, batch: int, pos: int, seed: int) -> list[int]:
    reqs = mk(batch, temperature=1.0)
    reqs[pos] = mk(1, temperature=1.0, sampling_seed=seed)[0]
    s = sampler(sampler_seed)
    toks = []
    for _ in range(30):
        step = s.sample(LOGITS.repeat(batch, 1).clone(), reqs)
        for r, t in zip(reqs, step):
            r.output_ids.append(t)
        toks.append(step[pos])
    return toks


def test_same_seed_same_tokens_regardless_of_batch():
    a = _seeded_run(sampler_seed=1, batch=1, pos=0, seed=123)
    b = _seeded_run(sampler_seed=2, batch=3, pos=1, seed=123)  # other rows, other global noise
    c = _seeded_run(sampler_seed=1, batch=1, pos=0, seed=124)
    assert a == b
    assert a != c
    assert len(set(a)) > 1  # it did sample


def test_penalties_shift_logits_exactly():
    s = sampler()
    out = [0, 0, 3]
    r = mk(1, prompt=(5,), out=out, temperature=0.0, frequency_penalty=0.5, presence_penalty=0.25)
    logits = LOGITS.clone()[None]
    s._apply_penalties(logits, r, [0])
    exp = LOGITS.clone()
    exp[0] -= 2 * 0.5 + 0.25
    exp[3] -= 1 * 0.5 + 0.25
    assert torch.allclose(logits[0], exp)

    r = mk(1, prompt=(0, 5), out=[4], temperature=0.0, repetition_penalty=2.0)
    logits = LOGITS.clone()[None]
    s._apply_penalties(logits, r, [0])
    exp = LOGITS.clone()
    exp[0] /= 2.0  # positive: divided
    exp[4] *= 2.0  # negative: multiplied
    exp[5] *= 2.0
    assert torch.allclose(logits[0], exp)


def test_min_new_tokens_masks_eos_and_stop_ids():
    s = sampler()
    logits = torch.full((2, V), -5.0)
    logits[:, EOS] = 10.0
    logits[:, 3] = 9.0
    reqs = (mk(1, out=[1], temperature=0.0, min_new_tokens=3, stop_token_ids=[3])
            + mk(1, out=[1, 1, 1], temperature=0.0, min_new_tokens=3))
    assert s.sample(logits, reqs) == [0, EOS]


@pytest.mark.parametrize("field,value", [
    ("top_p", 0.0), ("top_p", 1.5), ("top_k", 0), ("top_k", -2), ("min_p", -0.1), ("min_p", 1.1),
    ("temperature", -1.0), ("frequency_penalty", 2.5), ("presence_penalty", -3.0),
    ("repetition_penalty", 0.0), ("repetition_penalty", 2.5), ("max_new_tokens", -1), ("n", 0),
    # strict types (limits.need_*): bools are bools, ints are not bools and fit int64, numbers are finite
    ("ignore_eos", "no"), ("skip_special_tokens", 0), ("no_stop_trim", 1), ("top_k", 2**64), ("top_k", True),
    ("sampling_seed", 2**64), ("sampling_seed", 1.0), ("max_new_tokens", 2.0), ("n", 65), ("temperature", float("nan")),
    ("top_p", float("inf")), ("min_p", 10**400), ("stop_token_ids", [True]), ("stop_token_ids", [2**64]),
    ("stop", ["a", "\ud800"]), ("stop", ["a"] * 129), ("regex", 5),
])
def test_invalid_parameters_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams.from_dict({field: value})


def test_min_new_tokens_beyond_max_and_unknown_keys_are_rejected():
    with pytest.raises(ValueError, match="min_new_tokens"):
        SamplingParams.from_dict({"max_new_tokens": 4, "min_new_tokens": 5})
    with pytest.raises(ValueError, match="bogus"):
        SamplingParams.from_dict({"bogus": 1})


def test_logit_bias_is_added_exactly_and_rides_the_wire():
    r = mk(1, temperature=0.0, logit_bias={"3": 2.5, "5": -1.0})
    assert r[0].sampling.logit_bias == {3: 2.5, 5: -1.0}  # JSON's string keys normalized to ids
    again = SamplingParams.from_dict(r[0].sampling.to_wire())  # int keys (the scheduler's side) are taken too
    assert again.logit_bias == {3: 2.5, 5: -1.0}
    logits = LOGITS.clone().repeat(2, 1)
    reqs = r + mk(1, temperature=0.0)
    Sampler._apply_logit_bias(logits, reqs)
    exp = LOGITS.clone()
    exp[3] += 2.5
    exp[5] -= 1.0
    assert torch.equal(logits[0], exp)
    assert torch.equal(logits[1], LOGITS)  # the row without a bias is untouched


def test_logit_bias_steers_greedy_and_sampling_per_row():
    # +100 forces token 6 (the least likely) under greedy and sampling; -100 bans the argmax (0)
    forced = mk(1, temperature=0.0, logit_bias={"6": 100})
    banned = mk(1, temperature=0.0, logit_bias={"0": -100})
    hot = mk(1, temperature=1.5, logit_bias={"6": 100})
    plain = mk(1, temperature=0.0)
    assert draws(forced + banned + hot + plain) == [6, 7, 6, 0]  # 7: the second-largest logit
    assert set(draws(mk(300, temperature=1.0, logit_bias={"0": -100, "7": -100}))) <= {1, 2, 3, 4, 5, 6}


def test_logit_bias_cannot_lift_a_suppressed_token():
    s = sampler()
    logits = torch.full((1, V), -5.0)
    reqs = mk(1, out=[1], temperature=0.0, min_new_tokens=3, logit_bias={str(EOS): 100})
    assert s.sample(logits, reqs) != EOS  # min_new_tokens' -inf stays -inf


@pytest.mark.parametrize("value", [
    [1], {"x": 1.0}, {"-1": 1.0}, {"1.5": 1.0}, {"1": 101}, {"1": -100.5}, {"1": float("nan")}, {"1": "5"},
    {"1": True}, {str(i): 1 for i in range(1025)},
])
def test_bad_logit_bias_names_the_field(value):
    with pytest.raises(ValueError, match="logit_bias") as e:
        SamplingParams.from_dict({"logit_bias": value})
    assert e.value.param == "logit_bias"


def test_logit_bias_ids_are_checked_against_the_vocabulary():
    sp = SamplingParams.from_dict({"logit_bias": {"3": 1.0, str(V): 1.0}})
    with pytest.raises(ValueError, match=r"logit_bias keys must be token ids in \[0, 8\)"):
        sp.check_vocab(V)
