"""LoRA adapters, tensor parallelism and the hierarchical cache together: a tp=2 Engine (two local processes,
gloo) stores a prompt's records under adapter alpha and under the base in L2 (rank 0 gathers every rank's KV
heads into each record, model/executor/tp_kv.py); a restarted tp=2 Engine that numbers the adapters the other way
round loads them back into both ranks' heads: alpha (under its new id) and the base get their own records, beta
(alpha's old id) nothing; every output equals transformers + peft merged (float32, token for token)."""

from __future__ import annotations

from lora_adapters import build_base_and_adapters

LONG = [(13 * i + 7) % 4000 + 10 for i in range(100)]  # 3 whole records of 32 tokens
SP = {"max_new_tokens": 6, "min_new_tokens": 6, "temperature": 0}


def test_tp2_records_follow_the_adapter_into_every_rank(tmp_path):
    from radixlang_runtime import Engine

    root = tmp_path / "models"
    want = build_base_and_adapters(root, prompts=(LONG,))
    want = {(None if name == "" else name): w[tuple(LONG)][:6] for name, w in want.items()}  # base: None, as lora_path
    assert len(set(map(tuple, want.values()))) == 3  # the comparison can fail
    kw = dict(dtype="float32", max_total_tokens=1024, tp_size=2, enable_hierarchical_cache=True, hicache_size=0.01,
              hicache_storage_dir=str(tmp_path / "l2"), hicache_load_policy="always")
    with Engine(str(root / "base"), lora_paths=[f"alpha={root / 'alpha'}", f"beta={root / 'beta'}"], **kw) as eng:
        assert eng.runner.shard.size == 2
        for name in ("alpha", None):
            assert eng.generate(input_ids=LONG, sampling_params=SP, lora_path=name)["output_ids"] == want[name]
    # write_back: the shutdown stored the records; now beta has id 1 (alpha's before), alpha id 2
    with Engine(str(root / "base"), lora_paths=[f"beta={root / 'beta'}", f"alpha={root / 'alpha'}"], **kw) as eng:
        for name, cached in (("beta", 0), ("alpha", 96), (None, 96)):
            out = eng.generate(input_ids=LONG, sampling_params=SP, lora_path=name)
            assert out["output_ids"] == want[name], name
            assert out["meta_info"]["cached_tokens"] == cached, name
        assert eng.get_stats()["hicache"]["hit_tokens"]["l2"] == 192
        eng.check_integrity()
