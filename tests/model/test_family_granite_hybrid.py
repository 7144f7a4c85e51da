"""Granite 4.0-H (GraniteMoeHybridForCausalLM, Mamba2 hybrid): tiny random checkpoints written by transformers,
served by the Engine in float32 with prefill chunks shorter than the prompt, greedy token for token against
transformers' generate: one prompt alone, a batch of prompts of different lengths, a request extending a
finished one (its finish snapshot) and another continuation of the first prompt (its prompt-end snapshot), a
one-token prompt, a pool tight enough to retract, NGRAM drafts verified and rolled back, the torch decode path
beside the C kernels'; the state pool whole after each; the same through a real HTTP server; the Mamba2 forms
against transformers' torch reference; what is not honoured refused by name."""

from __future__ import annotations

import pytest
import torch

from radixlang_kernels.cpu_caps import detect
from radixlang_runtime.model.loader.config import ModelConfig
from tiny_checkpoints import GRANITE_CASES as CASES, GRANITE_TINY as TINY, build_tiny, built_tiny, hf_greedy

NEW = 6
LONG = list(range(300, 400))  # 100 tokens: four prefill chunks of 32
PROMPTS = [LONG, [5, 77, 1200, 9, 4000, 31]]
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
FINISHED = (len(LONG) + NEW - 1) // 4 * 4  # page 4: where a finished first turn on LONG leaves its state
ENGINE = dict(dtype="float32", max_total_tokens=1024, page_size=4, chunked_prefill_size=32,
              debug_check_integrity=True)

def _tiny(name, tmp_path_factory):
    return built_tiny(name, CASES, TINY, tmp_path_factory)


@pytest.fixture(scope="module", params=sorted(CASES))
def tiny(request, tmp_path_factory):
    return _tiny(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    return _tiny("granite_moe_nope", tmp_path_factory)


def test_greedy_matches_transformers_and_prefixes_hit_state_snapshots(tiny):
    from radixlang_runtime import Engine

    path, model = tiny
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    with Engine(str(path), **ENGINE) as eng:
        alone = eng.generate(input_ids=LONG, sampling_params=SP)  # one prompt in four chunks
        assert alone["output_ids"] == want[0]
        eng.flush_cache()
        outs = eng.generate(input_ids=PROMPTS, sampling_params=SP)  # a batch of different lengths
        assert [o["output_ids"] for o in outs] == want
        extended = LONG + want[0] + [11, 12, 13, 14, 15]
        again = eng.generate(input_ids=extended, sampling_params=SP)
        assert again["output_ids"] == hf_greedy(model, extended, NEW)
        # the first turn's finish: a snapshot at the last page boundary of what it computed
        assert again["meta_info"]["cached_tokens"] == FINISHED == 104
        sibling = LONG + [21, 22, 23]  # another continuation of the first prompt: its prompt-end snapshot
        other = eng.generate(input_ids=sibling, sampling_params=SP)
        assert other["output_ids"] == hf_greedy(model, sibling, NEW)
        assert other["meta_info"]["cached_tokens"] == len(LONG)
        one = eng.generate(input_ids=[7], sampling_params=SP)  # a one-token prompt: a decode row from zeros
        assert one["output_ids"] == hf_greedy(model, [7], NEW)
        eng.check_integrity()
        stats = eng.get_stats()
    pool = stats["state_pool"]
    assert pool["snapshot_hits"] >= 2 and pool["request_slots_in_use"] == 0
    assert pool["linear_layers"] == sum(t in ("mamba", "linear_attention") for t in model.config.layer_types)
    # decode through mamba2.c where the kernels build (kernels/tests/test_mamba2.py), else torch ops
    decode = "torch" if detect().compiler is None else f"c:{detect().isa}"
    assert stats["cpu"]["paths"]["linear_attention"] == f"decode {decode}, prefill torch:chunked"


def test_the_torch_decode_path_matches_transformers_too(tiny_moe, monkeypatch):
    """The Mamba2 decode without the C kernels (their fallback: torch ops over gathered states), a finish snapshot
    hit included."""
    from radixlang_runtime import Engine
    from radixlang_runtime.model.models.granite_hybrid import GraniteMoeHybridForCausalLM
    from radixlang_runtime.model.models.llama import LlamaForCausalLM

    monkeypatch.setattr(GraniteMoeHybridForCausalLM, "enable_cpu_ops", LlamaForCausalLM.enable_cpu_ops)
    path, model = tiny_moe
    with Engine(str(path), **ENGINE) as eng:
        first = eng.generate(input_ids=LONG, sampling_params=SP)
        extended = LONG + first["output_ids"] + [11, 12]
        again = eng.generate(input_ids=extended, sampling_params=SP)
        eng.check_integrity()
        paths = eng.get_stats()["cpu"]["paths"]
    assert paths["linear_attention"] == "decode torch, prefill torch:chunked"
    assert first["output_ids"] == hf_greedy(model, LONG, NEW)
    assert again["output_ids"] == hf_greedy(model, extended, NEW)
    assert again["meta_info"]["cached_tokens"] == FINISHED


def test_a_tight_pool_retracts_and_recomputes_the_state(tiny_moe):
    """Four requests of 40 + 16 tokens in a pool of 160: decode retracts; the re-prefill recomputes the state
    (or continues from a snapshot of the retracted request's own chunks)."""
    from radixlang_runtime import Engine

    path, model = tiny_moe
    prompts = [list(range(500 + 50 * i, 540 + 50 * i)) for i in range(4)]
    want = [hf_greedy(model, p, 16) for p in prompts]
    sp = {"max_new_tokens": 16, "min_new_tokens": 16, "temperature": 0}
    with Engine(str(path), **{**ENGINE, "max_total_tokens": 160}, new_token_ratio_init=0.05,
                new_token_ratio_min=0.05) as eng:
        outs = eng.generate(input_ids=prompts, sampling_params=sp)
        eng.check_integrity()
        assert eng.get_stats()["state_pool"]["request_slots_in_use"] == 0
    assert [o["output_ids"] for o in outs] == want
    assert sum(o["meta_info"]["num_retractions"] for o in outs) > 0


def test_ngram_drafts_roll_the_mamba2_state_back(tmp_path):
    """NGRAM's drafts through the verify step (recurrent_steps.verify_positions): the head scores four tokens
    only, so drafts are proposed, some accepted and some rejected; the output is transformers' all the same."""
    from radixlang_runtime import Engine

    alphabet = [300, 301, 302, 303]
    model = build_tiny(tmp_path, *CASES["granite_moe_nope"][:1], TINY, CASES["granite_moe_nope"][1])
    with torch.no_grad():
        keep = model.lm_head.weight[alphabet].clone()
        model.lm_head.weight.zero_()
        model.lm_head.weight[alphabet] = keep
    model.save_pretrained(tmp_path, safe_serialization=True)
    prompts, new = [[300, 301, 302, 303, 0] * 8, [302, 300, 0, 301] * 5], 40
    with Engine(str(tmp_path), dtype="float32", max_total_tokens=1024, page_size=4, speculative_algorithm="NGRAM",
                debug_check_integrity=True) as eng:
        got = eng.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": new})
        eng.check_integrity()
        assert eng.get_stats()["state_pool"]["request_slots_in_use"] == 0
    assert [o["output_ids"] for o in got] == [hf_greedy(model, p, new) for p in prompts]
    drafted = sum(o["meta_info"]["spec_draft_tokens"] for o in got)
    assert 0 < sum(o["meta_info"]["spec_accepted_tokens"] for o in got) < drafted


def test_mamba2_forms_match_transformers_reference():
    """The chunked scan from a carried state (any chunk length) and the recurrent step, against transformers'
    mamba2_chunk_scan and mamba2_selective_state_update."""
    from transformers.models.granitemoehybrid import modeling_granitemoehybrid as ref

    from radixlang_runtime.model.layers.mamba2 import chunk_scan, step

    torch.manual_seed(0)
    L, H, P, N, G = 37, 4, 3, 5, 2
    x, dt = torch.randn(1, L, H, P), torch.randn(1, L, H)
    A, D, bias = -2 * torch.rand(H), torch.randn(H), torch.randn(H)
    B, C = torch.randn(1, L, G, N), torch.randn(1, L, G, N)
    state = torch.randn(1, H, P, N)
    want, want_state = ref.mamba2_chunk_scan(x, dt, A, B, C, 8, D=D, dt_bias=bias, initial_states=state,
                                             dt_softplus=True, return_final_states=True)
    soft = torch.nn.functional.softplus(dt[0] + bias)
    Bh, Ch = B[0].repeat_interleave(H // G, dim=1), C[0].repeat_interleave(H // G, dim=1)
    for chunk in (8, 5, L):
        got, got_state = chunk_scan(x[0], soft, A, Bh, Ch, D, state[0], chunk)
        torch.testing.assert_close(got, want[0], rtol=0, atol=1e-5)
        torch.testing.assert_close(got_state, want_state[0], rtol=0, atol=1e-5)
    ref_state = state.clone()  # updated in place
    want1 = ref.mamba2_selective_state_update(
        ref_state, x[:, 0], dt[:, 0, :, None].expand(-1, -1, P), A[:, None, None].expand(-1, P, N), B[:, 0],
        C[:, 0], D[:, None].expand(-1, P), dt_bias=bias[:, None].expand(-1, P), dt_softplus=True)
    got1, got1_state = step(x[:, 0], soft[None, 0], A, Bh[None, 0], Ch[None, 0], D, state)
    torch.testing.assert_close(got1, want1, rtol=0, atol=1e-6)
    torch.testing.assert_close(got1_state, ref_state, rtol=0, atol=1e-6)


def config(**over) -> dict:
    return {"architectures": ["GraniteMoeHybridForCausalLM"], "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "mamba_n_heads": 4,
            "mamba_d_state": 8, "layer_types": ["mamba", "attention"], **over}


def test_config_reads_granite_fields():
    cfg = ModelConfig.from_dict(config(attention_multiplier=0.25, embedding_multiplier=12, logits_scaling=6,
                                       time_step_limit=[0.0, {"__float__": "Infinity"}]))
    spec = cfg.linear_attn
    assert spec.linear_layers == (True, False) and spec.head_dim == 16  # "auto": 2 x 32 / 4
    assert spec.state_shapes() == ((4, 16, 8), (64 + 2 * 8, 3))
    assert cfg.kv_layer_count == 1 and cfg.attn_scale == 0.25 and cfg.moe.num_experts == 8
    assert cfg.family_options.embedding_multiplier == 12 and not cfg.family_options.rope
    legacy = ModelConfig.from_dict(config(layer_types=None, layers_block_type=["attention", "mamba"],
                                          num_local_experts=0, position_embedding_type="rope"))
    assert legacy.linear_attn.linear_layers == (False, True) and legacy.moe is None and legacy.family_options.rope


@pytest.mark.parametrize("over, match", [
    (dict(layer_types=["mamba", "sliding_attention"]), "layer_types entry 'sliding_attention'"),
    (dict(position_embedding_type="alibi"), "position_embedding_type 'alibi'"),
    (dict(time_step_limit=[0.001, 0.1]), "time_step_limit"),
    (dict(normalization_function="layernorm"), "normalization_function 'layernorm'"),
    (dict(hidden_act="gelu"), "hidden_act 'gelu'"),
    (dict(mamba_d_head=10), "mamba_d_head 10"),
    (dict(mamba_n_groups=3), "mamba_n_groups 3"),
    (dict(output_router_logits=True), "output_router_logits"),
])
def test_config_fields_not_honoured_are_refused_by_name(over, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_dict(config(**over))


def test_tensor_parallelism_is_refused_by_name():
    spec = ModelConfig.from_dict(config()).linear_attn
    assert spec.split(1) is spec
    with pytest.raises(ValueError, match="tp_size 2 is not supported for Mamba2 layers"):
        spec.split(2)


def test_bfloat16_runs_with_the_cpu_kernels(tiny_moe):
    """bfloat16: packed linears and the C norms around the Mamba2 layers; a state hit there too."""
    from radixlang_runtime import Engine

    path, _ = tiny_moe
    with Engine(str(path), **{**ENGINE, "dtype": "bfloat16"}) as eng:
        out = eng.generate(input_ids=LONG, sampling_params=SP)
        again = eng.generate(input_ids=LONG + out["output_ids"] + [9, 9], sampling_params=SP)
        eng.check_integrity()
    assert len(out["output_ids"]) == len(again["output_ids"]) == NEW
    assert again["meta_info"]["cached_tokens"] == FINISHED


def test_http_server_continues_from_the_state_snapshot(tiny_moe):
    """A real launch_server process: /generate, a continuation from the finished request's snapshot, a chat
    completion through the template; /server_info shows every request slot free and the pool as sized."""
    import httpx

    from server_utils import ServerProcess

    path, model = tiny_moe
    srv = ServerProcess("--model-path", str(path), "--dtype", "float32", "--max-total-tokens", "1024",
                        "--page-size", "4", "--chunked-prefill-size", "32", "--max-mamba-cache-size", "12")
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as client:
            first = client.post("/generate", json={"input_ids": LONG, "sampling_params": SP}).json()
            extended = LONG + first["output_ids"] + [40, 41, 42]
            second = client.post("/generate", json={"input_ids": extended, "sampling_params": SP}).json()
            chat = client.post("/v1/chat/completions", json={
                "model": "default", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": NEW,
                "temperature": 0})
            info = client.get("/server_info").json()
    finally:
        srv.stop()
    assert first["output_ids"] == hf_greedy(model, LONG, NEW)
    assert second["output_ids"] == hf_greedy(model, extended, NEW)
    assert second["meta_info"]["cached_tokens"] == FINISHED
    assert chat.status_code == 200
    assert chat.json()["usage"]["completion_tokens"] == NEW
    pool = info["stats"]["state_pool"]
    assert (pool["state_slots"], pool["snapshot_slots"], pool["request_slots_in_use"]) == (12, 9, 0)
    assert pool["snapshot_hits"] >= 1 and pool["state_pool_bytes"] == 12 * pool["state_bytes_per_slot"]
