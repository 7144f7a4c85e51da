"""Hybrid families (Qwen3-Next with its MoE, Qwen3.5 text): tiny random checkpoints written by transformers,
served by the Engine in float32 with prefill chunks shorter than the prompt, greedy token for token against
transformers' generate; a request extending a finished one continues from a state snapshot (cached tokens >
0: the first turn's finish saved it) and still matches, as does another continuation of the first prompt (its
prompt-end snapshot); a pool tight enough to retract; the Gated DeltaNet forms against transformers' torch
reference; what a recurrent state cannot honour refused by name."""

from __future__ import annotations

import pytest
import torch

from radixlang_kernels.cpu_caps import detect
from radixlang_runtime.model.loader.config import ModelConfig
from tiny_checkpoints import HYBRID_CASES as CASES, HYBRID_TINY as TINY, build_tiny, built_tiny, hf_greedy

NEW = 6
LONG = list(range(300, 400))  # 100 tokens: four prefill chunks of 32
PROMPTS = [LONG, [5, 77, 1200, 9, 4000, 31]]
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
FINISHED = (len(LONG) + NEW - 1) // 4 * 4  # page 4: where a finished first turn on LONG leaves its state


def _tiny(name, tmp_path_factory):
    return built_tiny(name, CASES, TINY, tmp_path_factory)


@pytest.fixture(scope="module", params=sorted(CASES))
def tiny(request, tmp_path_factory):
    return _tiny(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def tiny_next(tmp_path_factory):
    return _tiny("qwen3_next", tmp_path_factory)


def test_greedy_matches_transformers_and_an_extension_hits_a_state_snapshot(tiny):
    from radixlang_runtime import Engine

    path, model = tiny
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    with Engine(str(path), dtype="float32", max_total_tokens=1024, page_size=4, chunked_prefill_size=32,
                debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=SP)
        assert [o["output_ids"] for o in outs] == want
        extended = LONG + want[0] + [11, 12, 13, 14, 15]
        again = eng.generate(input_ids=extended, sampling_params=SP)
        assert again["output_ids"] == hf_greedy(model, extended, NEW)
        # the first turn's finish: a snapshot at the last page boundary of what it computed (prompt + output but
        # the last token), beyond its prompt's end (a prefill step's snapshot at 100)
        assert again["meta_info"]["cached_tokens"] == FINISHED == 104
        sibling = LONG + [21, 22, 23]  # another continuation of the first prompt: its prompt-end snapshot
        other = eng.generate(input_ids=sibling, sampling_params=SP)
        assert other["output_ids"] == hf_greedy(model, sibling, NEW)
        assert other["meta_info"]["cached_tokens"] == len(LONG)
        one = eng.generate(input_ids=[7], sampling_params=SP)  # a one-token prompt: a decode row from zeros
        assert one["output_ids"] == hf_greedy(model, [7], NEW)
        eng.check_integrity()
        stats = eng.get_stats()
    assert stats["state_pool"]["snapshot_hits"] >= 1
    assert stats["state_pool"]["request_slots_in_use"] == 0
    if detect().compiler is not None:  # through gated_deltanet.c (kernels/tests/test_gated_deltanet.py)
        isa = detect().isa
        assert stats["cpu"]["paths"]["linear_attention"] == f"decode c:{isa}, prefill c:{isa}:recurrent"


def test_the_torch_decode_path_matches_transformers_too(tiny_next, monkeypatch):
    """The DeltaNet without the C kernels (their fallback: torch ops over gathered states, the chunk form for
    prefill), a finish snapshot hit included."""
    from radixlang_runtime import Engine
    from radixlang_runtime.model.models.llama import LlamaForCausalLM
    from radixlang_runtime.model.models.qwen3_next import HybridForCausalLM

    monkeypatch.setattr(HybridForCausalLM, "enable_cpu_ops", LlamaForCausalLM.enable_cpu_ops)
    path, model = tiny_next
    with Engine(str(path), dtype="float32", max_total_tokens=1024, page_size=4, chunked_prefill_size=32,
                debug_check_integrity=True) as eng:
        first = eng.generate(input_ids=LONG, sampling_params=SP)
        extended = LONG + first["output_ids"] + [11, 12]
        again = eng.generate(input_ids=extended, sampling_params=SP)
        eng.check_integrity()
        paths = eng.get_stats()["cpu"]["paths"]
    assert paths["linear_attention"] == "decode torch, prefill torch:chunked"
    assert first["output_ids"] == hf_greedy(model, LONG, NEW)
    assert again["output_ids"] == hf_greedy(model, extended, NEW)
    assert again["meta_info"]["cached_tokens"] == FINISHED


def test_a_tight_pool_retracts_and_recomputes_the_state(tiny_next):
    """Four requests of 40 + 16 tokens in a pool of 160: decode retracts; the re-prefill recomputes the state
    (or continues from a snapshot of the retracted request's own chunks)."""
    from radixlang_runtime import Engine

    path, model = tiny_next
    prompts = [list(range(500 + 50 * i, 540 + 50 * i)) for i in range(4)]
    with torch.no_grad():  # one batch (same lengths: no padding), transformers' greedy for all four at once
        out = model.generate(torch.tensor(prompts), attention_mask=torch.ones(4, 40, dtype=torch.long),
                             max_new_tokens=16, min_new_tokens=16, do_sample=False, eos_token_id=2, pad_token_id=2)
    want = out[:, 40:].tolist()
    sp = {"max_new_tokens": 16, "min_new_tokens": 16, "temperature": 0}
    with Engine(str(path), dtype="float32", max_total_tokens=160, page_size=4, chunked_prefill_size=32,
                new_token_ratio_init=0.05, new_token_ratio_min=0.05,
                debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=prompts, sampling_params=sp)
        eng.check_integrity()
    assert [o["output_ids"] for o in outs] == want
    assert sum(o["meta_info"]["num_retractions"] for o in outs) > 0


def test_deltanet_forms_match_transformers_reference():
    """The chunk-parallel form from a carried state and the recurrent step, against transformers' functions."""
    from transformers.models.qwen3_next import modeling_qwen3_next as ref

    from radixlang_runtime.model.layers.gated_deltanet import chunk_rule, l2norm, recurrent_step

    torch.manual_seed(0)
    L, H, Dk, Dv = 150, 3, 8, 6  # three chunks, the last one partial
    q, k = torch.randn(1, L, H, Dk), torch.randn(1, L, H, Dk)
    v, beta = torch.randn(1, L, H, Dv), torch.rand(1, L, H)
    g = -torch.rand(1, L, H)
    state = torch.randn(1, H, Dk, Dv)
    want, want_state = ref.torch_chunk_gated_delta_rule(q, k, v, g, beta, initial_state=state,
                                                        output_final_state=True, use_qk_l2norm_in_kernel=True)
    tr = [x[0].transpose(0, 1) for x in (q, k, v, g, beta)]  # [H, L, ...]
    got, got_state = chunk_rule(l2norm(tr[0]) * Dk ** -0.5, l2norm(tr[1]), *tr[2:], state[0])
    torch.testing.assert_close(got.transpose(0, 1), want[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got_state, want_state[0], rtol=0, atol=1e-5)
    want1, want1_state = ref.torch_recurrent_gated_delta_rule(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1],
                                                              initial_state=state, output_final_state=True,
                                                              use_qk_l2norm_in_kernel=True)
    got1, got1_state = recurrent_step(l2norm(q[:, 0]) / Dk ** 0.5, l2norm(k[:, 0]), v[:, 0], g[:, 0], beta[:, 0],
                                      state)
    assert torch.equal(got1, want1[:, 0]) and torch.equal(got1_state, want1_state)


def config(arch: str, **over) -> dict:
    return {"architectures": [arch], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
            "linear_num_key_heads": 1, "linear_num_value_heads": 2, **over}


def test_config_fields_not_honoured_are_refused_by_name():
    cfg = ModelConfig.from_dict(config("Qwen3_5ForCausalLM"))
    assert cfg.linear_attn.linear_layers == (True, True, True, False)  # full_attention_interval 4
    assert cfg.kv_layer_count == 1 and cfg.rope.rotary_dim == 4  # partial_rotary_factor 0.25 by default
    mrope = {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1],
             "mrope_interleaved": True}
    assert ModelConfig.from_dict(config("Qwen3_5ForCausalLM", rope_parameters=mrope)).rope.rotary_dim == 8
    with pytest.raises(ValueError, match="rope field 'mrope_interleaved'"):  # text positions only in Qwen3.5
        ModelConfig.from_dict(config("Qwen3NextForCausalLM", rope_parameters=mrope))
    with pytest.raises(ValueError, match="layer_types entry 'sliding_attention'"):
        ModelConfig.from_dict(config("Qwen3_5ForCausalLM", layer_types=["sliding_attention"] * 4))
    with pytest.raises(ValueError, match="linear_num_value_heads 3 must be a multiple"):
        ModelConfig.from_dict(config("Qwen3NextForCausalLM", linear_num_key_heads=2, linear_num_value_heads=3))
    with pytest.raises(ValueError, match="Qwen3_5ForConditionalGeneration"):
        ModelConfig.from_dict(config("Qwen3_5ForConditionalGeneration"))
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        ModelConfig.from_dict(config("Qwen3NextForCausalLM", hidden_act="gelu"))


def test_lora_is_refused_at_start(tiny):
    from radixlang_runtime import Engine

    path, _ = tiny
    with pytest.raises(ValueError, match="enable_lora is not supported for Qwen3"):
        Engine(str(path), dtype="float32", max_total_tokens=256, enable_lora=True)


def test_drafts_pass_and_a_draft_model_is_refused():
    """Jump-forward and NGRAM verify drafts with the states rolled back (mem/verify_states.py): the args pass
    unchanged, --disable-jump-forward included; STANDALONE's draft model is refused by name."""
    from radixlang_runtime.model.executor.hybrid_args import check_hybrid_args
    from radixlang_runtime.server_args import ServerArgs

    cfg = ModelConfig.from_dict(config("Qwen3NextForCausalLM"))
    for flags in (dict(), dict(disable_jump_forward=True), dict(speculative_algorithm="NGRAM")):
        args = ServerArgs(model_path="m", **flags)
        assert check_hybrid_args(args, cfg) == args
    standalone = ServerArgs(model_path="m", speculative_algorithm="STANDALONE", speculative_draft_model_path="d")
    with pytest.raises(ValueError, match="speculative_algorithm STANDALONE is not supported for Qwen3NextForCausalLM"):
        check_hybrid_args(standalone, cfg)


@pytest.mark.parametrize("flags, name", [
    (dict(enable_hierarchical_cache=True), "enable_hierarchical_cache with tp_size > 1"),
    (dict(disaggregation_mode="prefill"), "disaggregation_mode with tp_size > 1"),
])
def test_state_records_under_tp_are_refused(flags, name):
    from radixlang_runtime.model.executor.hybrid_args import check_hybrid_args
    from radixlang_runtime.server_args import ServerArgs

    cfg = ModelConfig.from_dict(config("Qwen3_5ForCausalLM"))
    check_hybrid_args(ServerArgs(model_path="m", **flags), cfg)  # one rank: the records hold the whole state
    with pytest.raises(ValueError, match=f"{name} is not supported for Qwen3_5ForCausalLM"):
        check_hybrid_args(ServerArgs(model_path="m", tp_size=2, **flags), cfg)


def test_state_slots_share_the_memory_budget():
    from radixlang_runtime.model.executor.hybrid_args import state_slots
    from radixlang_runtime.server_args import ServerArgs

    assert state_slots(ServerArgs()) == (32, 96)  # request slots, then three snapshot slots each
    assert state_slots(ServerArgs(max_mamba_cache_size=40)) == (10, 30)
    assert state_slots(ServerArgs(max_mamba_cache_size=40, max_running_requests=4)) == (4, 36)
    assert state_slots(ServerArgs(disable_radix_cache=True)) == (32, 0)
    assert state_slots(ServerArgs(), bytes_per_slot=1000, budget=64_000) == (8, 24)  # half the budget: 32 slots
    with pytest.raises(ValueError, match="max_mamba_cache_size: 40 state slots of 1000 bytes"):
        state_slots(ServerArgs(max_mamba_cache_size=40), bytes_per_slot=1000, budget=64_000)


def test_the_pool_sized_from_memory_holds_kv_and_states(tiny_next):
    from radixlang_runtime import Engine

    path, _ = tiny_next
    with Engine(str(path), dtype="float32", kv_cache_budget_bytes=4 << 20, max_mamba_cache_size=8) as eng:
        out = eng.generate(input_ids=PROMPTS[1], sampling_params=SP)
        info = eng.get_stats()
    assert len(out["output_ids"]) == NEW
    pool = info["state_pool"]
    assert pool["state_slots"] == 8 and pool["snapshot_slots"] == 6
    kv = info["memory"]["kv_pool"]
    assert kv + pool["state_pool_bytes"] <= 4 << 20 and kv > (4 << 20) // 2


@pytest.mark.slow
def test_http_server_serves_a_state_hit_and_reports_the_state_pool(tiny_next):
    """The real server: /generate twice (the second extends the first: a state hit), /server_info's state pool."""
    import httpx

    from server_utils import ServerProcess

    path, model = tiny_next
    srv = ServerProcess("--model-path", str(path), "--dtype", "float32", "--max-total-tokens", "1024",
                        "--page-size", "4", "--chunked-prefill-size", "32", "--max-mamba-cache-size", "12")
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as client:
            first = client.post("/generate", json={"input_ids": LONG, "sampling_params": SP}).json()
            extended = LONG + first["output_ids"] + [40, 41, 42]
            second = client.post("/generate", json={"input_ids": extended, "sampling_params": SP}).json()
            info = client.get("/server_info").json()
    finally:
        srv.stop()
    assert first["output_ids"] == hf_greedy(model, LONG, NEW)
    assert second["output_ids"] == hf_greedy(model, extended, NEW)
    assert second["meta_info"]["cached_tokens"] == FINISHED
    pool = info["stats"]["state_pool"]
    assert (pool["state_slots"], pool["snapshot_slots"], pool["request_slots_in_use"]) == (12, 9, 0)
    assert pool["snapshots_held"] >= 4 and pool["state_pool_bytes"] == 12 * pool["state_bytes_per_slot"]


def test_max_mamba_cache_size_is_refused_for_a_model_without_state(tmp_path):
    from radixlang_runtime import Engine

    build_tiny(tmp_path, "Qwen3Config", {k: v for k, v in TINY.items() if not k.startswith("linear_")},
               {"intermediate_size": 96})
    with pytest.raises(ValueError, match="max_mamba_cache_size applies to hybrid models"):
        Engine(str(tmp_path), dtype="float32", max_total_tokens=256, max_mamba_cache_size=4)


def test_bfloat16_runs_with_the_cpu_kernels(tiny_next):
    """bfloat16: packed linears and the C norms around the DeltaNet; a state hit there too."""
    from radixlang_runtime import Engine

    path, _ = tiny_next
    with Engine(str(path), dtype="bfloat16", max_total_tokens=1024, page_size=4, chunked_prefill_size=32,
                debug_check_integrity=True) as eng:
        out = eng.generate(input_ids=LONG, sampling_params=SP)
        again = eng.generate(input_ids=LONG + out["output_ids"] + [9, 9], sampling_params=SP)
    assert len(out["output_ids"]) == len(again["output_ids"]) == NEW
    assert again["meta_info"]["cached_tokens"] == FINISHED
