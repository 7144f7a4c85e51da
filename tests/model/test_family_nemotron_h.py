"""Nemotron-H (NemotronHForCausalLM, Mamba2 hybrid of single-mixer blocks): tiny random checkpoints written by
transformers, served by the Engine in float32 with prefill chunks shorter than the prompt, greedy token for token
against transformers' generate: one prompt alone, a batch of prompts of different lengths, a finish snapshot and
a prompt-end snapshot hit, a one-token prompt; the state pool whole after; what is not honoured refused by name."""

from __future__ import annotations

import pytest

from radixlang_kernels.cpu_caps import detect
from radixlang_runtime.model.loader.config import ModelConfig
from tiny_checkpoints import NEMOTRON_CASES as CASES, NEMOTRON_TINY as TINY, build_tiny, hf_greedy

NEW = 6
LONG = list(range(300, 400))  # 100 tokens: four prefill chunks of 32
PROMPTS = [LONG, [5, 77, 1200, 9, 4000, 31]]
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
FINISHED = (len(LONG) + NEW - 1) // 4 * 4  # page 4: where a finished first turn on LONG leaves its state


@pytest.fixture(scope="module", params=sorted(CASES))
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    cls_name, kwargs = CASES[request.param]
    return path, build_tiny(path, cls_name, TINY, kwargs)


def test_greedy_matches_transformers_and_prefixes_hit_state_snapshots(tiny):
    from radixlang_runtime import Engine

    path, model = tiny
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    with Engine(str(path), dtype="float32", max_total_tokens=1024, page_size=4, chunked_prefill_size=32,
                debug_check_integrity=True) as eng:
        alone = eng.generate(input_ids=LONG, sampling_params=SP)
        assert alone["output_ids"] == want[0]
        eng.flush_cache()
        outs = eng.generate(input_ids=PROMPTS, sampling_params=SP)
        assert [o["output_ids"] for o in outs] == want
        extended = LONG + want[0] + [11, 12, 13, 14, 15]
        again = eng.generate(input_ids=extended, sampling_params=SP)
        assert again["output_ids"] == hf_greedy(model, extended, NEW)
        assert again["meta_info"]["cached_tokens"] == FINISHED
        sibling = LONG + [21, 22, 23]
        other = eng.generate(input_ids=sibling, sampling_params=SP)
        assert other["output_ids"] == hf_greedy(model, sibling, NEW)
        assert other["meta_info"]["cached_tokens"] == len(LONG)
        one = eng.generate(input_ids=[7], sampling_params=SP)
        assert one["output_ids"] == hf_greedy(model, [7], NEW)
        eng.check_integrity()
        stats = eng.get_stats()
    pool = stats["state_pool"]
    assert pool["snapshot_hits"] >= 2 and pool["request_slots_in_use"] == 0
    assert pool["linear_layers"] == model.config.layers_block_type.count("linear_attention")
    decode = "torch" if detect().compiler is None else f"c:{detect().isa}"  # mamba2.c where the kernels build
    assert stats["cpu"]["paths"]["linear_attention"] == f"decode {decode}, prefill torch:chunked"


def config(**over) -> dict:
    return {"architectures": ["NemotronHForCausalLM"], "vocab_size": 64, "hidden_size": 32, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 16, "mamba_num_heads": 4, "mamba_head_dim": 16,
            "ssm_state_size": 8, "n_groups": 2, "n_routed_experts": 4, **over}


def test_config_reads_the_pattern_and_the_layer_types():
    cfg = ModelConfig.from_dict(config(hybrid_override_pattern="M*-E"))
    assert cfg.family_options.layer_types == ("linear_attention", "full_attention", "mlp", "moe")
    assert cfg.num_hidden_layers == 4 and cfg.kv_layer_count == 1 and cfg.linear_attn.num_linear == 1
    assert cfg.linear_attn.state_shapes() == ((4, 16, 8), (64 + 2 * 2 * 8, 3))
    legacy = ModelConfig.from_dict(config(layers_block_type=["mamba", "attention", "mlp"]))
    assert legacy.family_options.layer_types == ("linear_attention", "full_attention", "mlp")
    assert legacy.family_options.routing is None


@pytest.mark.parametrize("over, match", [
    (dict(hybrid_override_pattern="M*X"), "hybrid_override_pattern character 'X'"),
    (dict(layers_block_type=["mamba", "sliding_attention"]), "layers_block_type entry 'sliding_attention'"),
    (dict(mlp_hidden_act="silu"), "mlp_hidden_act 'silu'"),
    (dict(mamba_hidden_act="gelu"), "mamba_hidden_act 'gelu'"),
    (dict(attention_bias=True), "attention_bias true"),
    (dict(sliding_window=128), "sliding_window 128"),
    (dict(time_step_limit=[0.0, 0.1]), "time_step_limit"),
    (dict(n_groups=3), "n_groups 3"),
    (dict(hybrid_override_pattern="ME", n_group=3), "n_group 3"),
])
def test_config_fields_not_honoured_are_refused_by_name(over, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_dict(config(**over))


def test_bfloat16_runs_with_the_cpu_kernels(tmp_path):
    """bfloat16: packed linears and the C norms around the Mamba2 and MoE blocks (the router in float32); a state
    hit there too."""
    from radixlang_runtime import Engine

    cls_name, kwargs = CASES["nemotron_h"]
    build_tiny(tmp_path, cls_name, TINY, kwargs)
    with Engine(str(tmp_path), dtype="bfloat16", max_total_tokens=1024, page_size=4, chunked_prefill_size=32,
                debug_check_integrity=True) as eng:
        out = eng.generate(input_ids=LONG, sampling_params=SP)
        again = eng.generate(input_ids=LONG + out["output_ids"] + [9, 9], sampling_params=SP)
        eng.check_integrity()
    assert len(out["output_ids"]) == len(again["output_ids"]) == NEW
    assert again["meta_info"]["cached_tokens"] == FINISHED
