"""LoRA with tensor parallelism: a tp=2 Engine (two local processes, gloo) serving a tiny random Llama and two
peft adapters (ranks 8 and 16 on every projection, split as SGLang splits them: model/layers/lora_tp.py); the
base and both adapters in one batch, float32 greedy token for token against transformers + peft merged; with
--max-loaded-loras 2, an adapter loaded at run time, evictions, reloads and an unload reach the other rank
(lora_registry.LoraResident) and the outputs stay equal to peft's."""

from __future__ import annotations

import pytest
from lora_adapters import ADAPTERS, OTHER, PROMPT, SP, build_base_and_adapters, record_steps


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_tp")
    return root, build_base_and_adapters(root)


@pytest.fixture(scope="module")
def engine(setup):
    from radixlang_runtime import Engine

    root, _ = setup
    with Engine(str(root / "base"), dtype="float32", max_total_tokens=2048, tp_size=2,
                lora_paths=[f"{n}={root / n}" for n in ADAPTERS], max_loras_per_batch=2, max_loaded_loras=2) as eng:
        yield eng


def test_tp2_mixed_batch_matches_peft_merged(setup, engine):
    _, want = setup
    assert engine.runner.shard.size == 2
    assert len({tuple(want[n][tuple(PROMPT)]) for n in ("", "alpha", "beta")}) == 3  # the comparison can fail
    seen = record_steps(engine)
    try:
        names = [None, "alpha", "beta", "alpha", None, "beta"]
        prompts = [PROMPT, PROMPT, PROMPT, OTHER, OTHER, OTHER]
        outs = engine.generate(input_ids=prompts, sampling_params=SP, lora_path=names)
    finally:
        del engine.runner._run
    assert [o["output_ids"] for o in outs] == [want[n or ""][tuple(p)] for n, p in zip(names, prompts)]
    assert any(set(ids) == {0, 1, 2} for ids in seen), seen  # base and both adapters in one forward pass
    engine.check_integrity()


def test_tp2_run_time_load_eviction_and_unload_reach_every_rank(setup, engine):
    root, want = setup
    before = engine.get_stats()["lora"]
    engine.load_lora_adapter("gamma", str(root / "beta"))  # beta's weights under a new name and id
    names = ["gamma", "alpha", None]  # beta is evicted on every rank to make room for these two
    outs = engine.generate(input_ids=[OTHER] * 3, sampling_params=SP, lora_path=names)
    assert [o["output_ids"] for o in outs] == [want[n][tuple(OTHER)] for n in ("beta", "alpha", "")]
    engine.unload_lora_adapter("gamma")
    out = engine.generate(input_ids=PROMPT, sampling_params=SP, lora_path="beta")  # read again, every rank
    assert out["output_ids"] == want["beta"][tuple(PROMPT)]
    after = engine.get_stats()["lora"]
    assert after["evictions"] > before["evictions"] and after["reloads"] > before["reloads"]
    assert sorted(after["resident"]) == ["alpha", "beta"]
    with pytest.raises(ValueError, match="gamma"):
        engine.generate(input_ids=PROMPT, sampling_params=SP, lora_path="gamma")
    engine.check_integrity()
