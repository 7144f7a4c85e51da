"""--speculative-algorithm NGRAM on hybrid models (tiny random Qwen3.5 text and Qwen3-Next checkpoints, float32,
greedy): n-gram drafts verified in one pass, the Gated DeltaNet's state rolled back to the last accepted draft
token (mem/verify_states.py). The checkpoints' head scores four tokens only (the rest of lm_head zeroed), so the
output is a text over a few tokens that copies itself often: drafts are proposed, some accepted, some rejected.
Outputs equal transformers token for token and the same engine without speculation; pools whole after."""

from __future__ import annotations

import pytest
import torch

from tiny_checkpoints import HYBRID_CASES, HYBRID_TINY, build_tiny, hf_greedy

ALPHABET = [300, 301, 302, 303]  # the head's only nonzero rows
PROMPTS = [[300, 301, 302, 303, 0] * 8, [302, 300, 0, 301] * 5]
NEW = 40


@pytest.fixture(scope="module", params=sorted(HYBRID_CASES))
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    cls_name, kwargs = HYBRID_CASES[request.param]
    model = build_tiny(path, cls_name, HYBRID_TINY, kwargs)
    assert not model.config.tie_word_embeddings
    with torch.no_grad():
        keep = model.lm_head.weight[ALPHABET].clone()
        model.lm_head.weight.zero_()
        model.lm_head.weight[ALPHABET] = keep
    model.save_pretrained(path, safe_serialization=True)
    return path, model


def run(path, spec) -> list[dict]:
    from radixlang_runtime import Engine

    with Engine(str(path), dtype="float32", max_total_tokens=1024, page_size=4, speculative_algorithm=spec,
                debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=PROMPTS, sampling_params={"temperature": 0, "max_new_tokens": NEW})
        eng.check_integrity()
        assert eng.get_stats()["state_pool"]["request_slots_in_use"] == 0
    return outs


def test_ngram_gives_the_tokens_decoding_gives(tiny):
    path, model = tiny
    got, plain = run(path, "NGRAM"), run(path, None)
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    assert [o["output_ids"] for o in plain] == want
    assert [o["output_ids"] for o in got] == want
    drafted = sum(o["meta_info"]["spec_draft_tokens"] for o in got)
    accepted = sum(o["meta_info"]["spec_accepted_tokens"] for o in got)
    assert 0 < accepted < drafted  # drafts taken, and rejected ones rolled back
    assert sum(o["meta_info"]["forward_passes"] for o in got) < sum(o["meta_info"]["forward_passes"] for o in plain)
