"""LoRA adapters with the hierarchical cache: a prefix's records are keyed by the adapter's content
(mem/tiers/keys.adapter_identity), not by its id. An engine stores a prompt's records under adapter alpha (L2 on
disk); a restart that numbers the adapters the other way round (beta takes alpha's old id) serves beta and the
base nothing of them, and alpha (under its new id) everything; every output equals transformers + peft merged
(float32, token for token)."""

from __future__ import annotations

from lora_adapters import build_base_and_adapters

LONG = [(11 * i + 5) % 4000 + 10 for i in range(100)]  # 3 whole records of 32 tokens
SP = {"max_new_tokens": 6, "min_new_tokens": 6, "temperature": 0}


def test_records_follow_the_adapter_not_its_id(tmp_path):
    from radixlang_runtime import Engine

    root = tmp_path / "models"
    want = build_base_and_adapters(root, prompts=(LONG,))
    want = {name: w[tuple(LONG)][:6] for name, w in want.items()}
    assert len(set(map(tuple, want.values()))) == 3  # the comparison can fail
    kw = dict(dtype="float32", max_total_tokens=1024, enable_hierarchical_cache=True, hicache_size=0.01,
              hicache_storage_dir=str(tmp_path / "l2"), hicache_load_policy="always")
    with Engine(str(root / "base"), lora_paths=[f"alpha={root / 'alpha'}", f"beta={root / 'beta'}"], **kw) as eng:
        assert eng.generate(input_ids=LONG, sampling_params=SP, lora_path="alpha")["output_ids"] == want["alpha"]
    # write_back: the shutdown stored alpha's records; now beta has id 1 (alpha's before), alpha id 2
    with Engine(str(root / "base"), lora_paths=[f"beta={root / 'beta'}", f"alpha={root / 'alpha'}"], **kw) as eng:
        for name, cached in (("beta", 0), (None, 0), ("alpha", 96)):
            out = eng.generate(input_ids=LONG, sampling_params=SP, lora_path=name)
            assert out["output_ids"] == want[name or ""], name
            assert out["meta_info"]["cached_tokens"] == cached, name
        assert eng.get_stats()["hicache"]["hit_tokens"]["l2"] == 96
        eng.check_integrity()
