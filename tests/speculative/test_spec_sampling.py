"""Speculation keeps the sampling distribution: chi-square tests of token frequencies at temperature 1 with
n-gram drafts against without, on sample_step alone (a deliberately biased acceptance rule is caught by the
same test, so it can fail) and end to end on a tiny random checkpoint through the Engine.

The threshold is fixed here, before any run: the frequencies differ when the homogeneity test's p-value is
below ALPHA. Every sample comes from seeded generators, so a run is reproducible."""

from __future__ import annotations

import pytest
import torch
from tiny_checkpoints import build_tiny

from radixlang_runtime.model.executor.sample_step import sample_step
from radixlang_runtime.model.executor.sampler import Sampler
from radixlang_runtime.model.executor.step_io import ModelBatch, SampleSpec, StepResult
from radixlang_runtime.protocol.sampling_params import SamplingParams

ALPHA = 1e-3  # chosen before looking: a correct rule fails 1 run in 1,000


def chi2_p(a: list[int], b: list[int]) -> float:
    """p-value of Pearson's chi-square test that samples a and b come from one distribution (a 2 x C table;
    categories expected < 5 times in either sample are pooled into one)."""
    cats = sorted(set(a) | set(b))
    ca = torch.tensor([a.count(c) for c in cats], dtype=torch.float64)
    cb = torch.tensor([b.count(c) for c in cats], dtype=torch.float64)
    tot = ca + cb
    ea, eb = tot * len(a) / tot.sum(), tot * len(b) / tot.sum()
    small = (ea < 5) | (eb < 5)
    if small.any():
        ca = torch.cat([ca[~small], ca[small].sum()[None]])
        cb = torch.cat([cb[~small], cb[small].sum()[None]])
        ea = torch.cat([ea[~small], ea[small].sum()[None]])
        eb = torch.cat([eb[~small], eb[small].sum()[None]])
    keep = (ea > 0) & (eb > 0)
    stat = (((ca - ea) ** 2 / ea) + ((cb - eb) ** 2 / eb))[keep].sum()
    df = int(keep.sum()) - 1
    if df < 1:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2.0))


def first_tokens(p0: torch.Tensor, p1: torch.Tensor, d: int, n: int, seed: int) -> tuple[list[int], list[bool]]:
    """n requests each verifying the point-mass draft [d] with rows p0, p1 through sample_step: the first token
    each emits, and whether its draft was accepted."""
    sp = SamplingParams.from_dict({"temperature": 1.0, "max_new_tokens": 8})
    specs = [SampleSpec(sp, [0], [], draft=[d]) for _ in range(n)]
    batch = ModelBatch("mixed", [str(i) for i in range(n)], list(range(n)), [0] * n, [[0, d]] * n, [[0, 0]] * n,
                       [], specs, [None] * n)
    logits = torch.stack([p0.log(), p1.log()] * n)
    result = StepResult()
    sample_step(batch, list(range(n)), [2] * n, logits, Sampler(len(p0), [], torch.device("cpu"), seed=seed), result)
    acc = [bool(result.accepted.get(i, 0)) for i in range(n)]
    return [d if a else result.next_token_ids[i] for i, a in enumerate(acc)], acc


def test_chi_square_accepts_sample_step_and_catches_a_biased_rule():
    """The first token with draft verification vs plain sampling from p0: same distribution. A rule that gives
    the draft two chances (accepted when either of two independent samples equals it) is detected."""
    d, n = 2, 4000
    p0 = torch.tensor([0.05, 0.15, 0.3, 0.2, 0.2, 0.1])
    p1 = torch.tensor([0.4, 0.1, 0.1, 0.2, 0.1, 0.1])
    g = torch.Generator().manual_seed(11)
    plain = torch.multinomial(p0, n, replacement=True, generator=g).tolist()
    spec, acc = first_tokens(p0, p1, d, n, seed=5)
    assert chi2_p(spec, plain) >= ALPHA
    _, acc2 = first_tokens(p0, p1, d, n, seed=6)
    biased = [d if a or b else t for t, a, b in zip(spec, acc, acc2)]
    assert chi2_p(biased, plain) < ALPHA


TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3, max_position_embeddings=512)


@pytest.fixture(scope="module")
def tiny_spec_engine(tmp_path_factory):
    from radixlang_runtime import Engine

    d = tmp_path_factory.mktemp("tiny_llama_spec")
    build_tiny(d, "LlamaConfig", TINY, {"initializer_range": 0.02})  # small weights: the last token is likely next
    with Engine(str(d), dtype="float32", max_total_tokens=8192, max_running_requests=128, random_seed=3,
                speculative_algorithm="NGRAM", speculative_num_draft_tokens=3,
                speculative_ngram_min_match_window_size=1) as eng:
        yield eng


def _third_tokens(eng, prompt: list[int], n: int, spec: bool) -> tuple[list[int], int]:
    """n unseeded temperature-1 samples (top-k 3) of the prompt's continuation: each one's third token, and
    the n-gram draft tokens accepted meanwhile. spec False: drafts are off (a batch-size limit of 1)."""
    def set_limit(s):
        s.drafts.drafter.cfg.disable_batch_size = 0 if spec else 1
        s.drafts.drafter.cfg.row_cost = 0.0  # every draft verified, at any batch size
    eng._loop.call(set_limit)
    sp = {"temperature": 1.0, "top_k": 3, "max_new_tokens": 4, "ignore_eos": True}
    outs = []
    for _ in range(n // 100):
        outs += eng.generate(input_ids=[prompt] * 100, sampling_params=sp)
    return [o["output_ids"][2] for o in outs], sum(o["meta_info"]["spec_accepted_tokens"] for o in outs)


def test_engine_temperature_one_frequencies_match_without_speculation(tiny_spec_engine):
    """On weights this small the model's likeliest next token is its last one, so after a prompt ending in a
    run of one token the n-gram drafts (more of it) are often sampled again. The third sampled token's
    frequencies with drafts (many accepted) match those without (chi-square, ALPHA)."""
    eng = tiny_spec_engine
    prompt = [(37 * i + 11) % 4000 + 10 for i in range(12)] + [777] * 4
    off, acc_off = _third_tokens(eng, prompt, 300, spec=False)
    on, acc_on = _third_tokens(eng, prompt, 300, spec=True)
    assert acc_off == 0 and acc_on >= 30  # speculation ran, and the model took many drafts
    assert chi2_p(on, off) >= ALPHA
