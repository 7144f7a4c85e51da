"""Mixture-of-experts families (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) end to end: tiny random checkpoints
written by transformers, served by the Engine in float32 with a small chunked prefill and a prefix-cache hit,
greedy token for token against transformers' generate on the same weights; the grouped expert block against
a per-token reference and against transformers' own block; MoE config fields not honoured refused by name."""

from __future__ import annotations

import pytest
import torch

from radixlang_runtime.model.loader.config import ModelConfig
from tiny_checkpoints import build_tiny, hf_greedy, with_config

PROMPTS = [list(range(300, 320)), [5, 77, 1200, 9, 4000, 31], list(range(300, 312)) + [50, 51]]  # 3rd: shares 12
NEW = 16
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, bos_token_id=1,
            eos_token_id=2, tie_word_embeddings=True, initializer_range=0.3, max_position_embeddings=256,
            num_experts_per_tok=2)

# name -> (transformers config class, its kwargs, save_pretrained kwargs, a config change that must change
# transformers' own tokens, so that the comparison can fail on the routing)
CASES = {
    "mixtral": ("MixtralConfig", {"intermediate_size": 32, "num_local_experts": 8}, {}, {"num_experts_per_tok": 1}),
    # transformers 5's stacked experts (experts.gate_up_proj [E, 2I, H]) rather than the hub's per-expert tensors
    "mixtral_stacked": ("MixtralConfig", {"intermediate_size": 32, "num_local_experts": 4},
                        {"save_original_format": False}, None),
    # layer 0 dense (mlp_only_layers), layer 1 sparse with the sigmoid-gated shared expert
    "qwen2_moe": ("Qwen2MoeConfig", {"intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 8,
                                     "shared_expert_intermediate_size": 48, "mlp_only_layers": [0]}, {},
                  {"norm_topk_prob": True}),
    "qwen3_moe": ("Qwen3MoeConfig", {"intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 6,
                                     "norm_topk_prob": True}, {}, {"norm_topk_prob": False}),
    "olmoe": ("OlmoeConfig", {"intermediate_size": 32, "num_experts": 8, "clip_qkv": 4.0}, {}, {"clip_qkv": None}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_matches_transformers(name, tmp_path):
    from radixlang_runtime import Engine

    cls_name, kwargs, save, contrast = CASES[name]
    model = build_tiny(tmp_path, cls_name, TINY, kwargs, save)
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    if contrast is not None:  # the routing detail changes transformers' own tokens: the comparison can fail
        assert [hf_greedy(with_config(model, contrast), p, NEW) for p in PROMPTS] != want
    sp = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
    # chunks of 8 tokens (pages of 4): the 20-token prompt prefills in three steps
    with Engine(str(tmp_path), dtype="float32", max_total_tokens=1024, page_size=4,
                chunked_prefill_size=8) as eng:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=sp)
        again = eng.generate(input_ids=PROMPTS[0], sampling_params=sp)  # prefix-cache hit: same tokens
    assert [o["output_ids"] for o in outs] == want
    assert again["output_ids"] == want[0]
    assert again["meta_info"]["cached_tokens"] > 0


def test_bfloat16_runs(tmp_path):
    from radixlang_runtime import Engine

    cls_name, kwargs, save, _ = CASES["qwen2_moe"]
    build_tiny(tmp_path, cls_name, TINY, kwargs, save)
    sp = {"max_new_tokens": 8, "min_new_tokens": 8, "temperature": 0}
    with Engine(str(tmp_path), dtype="bfloat16", max_total_tokens=1024, page_size=4,
                chunked_prefill_size=8) as eng:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=sp)
    assert [len(o["output_ids"]) for o in outs] == [8] * len(PROMPTS)


def test_tp2_splits_experts_and_matches_transformers(tmp_path):
    """Two gloo ranks: each expert's (and the shared expert's, and the dense layer's) intermediate columns
    split, one all-reduce after the block."""
    from radixlang_runtime import Engine

    cls_name, kwargs, save, _ = CASES["qwen2_moe"]
    model = build_tiny(tmp_path, cls_name, TINY, kwargs, save)
    want = [hf_greedy(model, p, 8) for p in PROMPTS[:2]]
    sp = {"max_new_tokens": 8, "min_new_tokens": 8, "temperature": 0}
    with Engine(str(tmp_path), dtype="float32", tp_size=2, max_total_tokens=1024) as eng:
        outs = eng.generate(input_ids=PROMPTS[:2], sampling_params=sp)
    assert [o["output_ids"] for o in outs] == want


def test_olmoe_refuses_tensor_parallel_by_name():
    from radixlang_runtime.model.models.moe_decoder import MoEForCausalLM
    from radixlang_runtime.model.executor.parallel import make_shard
    from radixlang_runtime.model.layers.rotary import Rotary

    cfg = ModelConfig.from_dict({**BASE, "architectures": ["OlmoeForCausalLM"]})
    shard = make_shard(4, 4, 128, 100, 2, 0)
    with torch.device("meta"), pytest.raises(ValueError, match="tp_size 2 is not supported for OlmoeForCausalLM"):
        MoEForCausalLM(cfg, None, Rotary(cfg.rope, 256, torch.device("cpu"), torch.float32), shard, None)


def test_deterministic_mode_is_refused_for_moe():
    from types import SimpleNamespace

    from radixlang_runtime.model.executor import deterministic

    cfg = ModelConfig.from_dict({**BASE, "architectures": ["Qwen3MoeForCausalLM"]})
    with pytest.raises(ValueError, match="Qwen3MoeForCausalLM's expert GEMMs .* not batch-invariant"):
        deterministic.enable(SimpleNamespace(cfg=cfg), None, None, torch.device("cpu"), torch.float32)


# ---------------------------------------------------------------------------------------- the block
def _naive(x, router, gate_up, down, top_k, renorm, weights_float32):
    """Per token: softmax over the router logits, its top-k experts, each expert's SwiGLU MLP."""
    inter = down.shape[2]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        probs = torch.softmax((router @ x[t]).float(), dim=-1)
        w, e = torch.topk(probs, top_k)
        if renorm:
            w = w / w.sum()
        for wj, ej in zip(w, e.tolist()):
            gu = gate_up[ej] @ x[t]
            y = down[ej] @ (torch.nn.functional.silu(gu[:inter]) * gu[inter:])
            out[t] += (y.float() * wj).to(x.dtype) if weights_float32 else y * wj.to(x.dtype)
    return out


@pytest.mark.parametrize("T,E,k,hidden,inter", [(1, 4, 2, 16, 8), (7, 8, 2, 32, 16), (33, 6, 3, 24, 12),
                                                (5, 16, 1, 8, 4)])
@pytest.mark.parametrize("renorm,weights_float32", [(True, True), (False, False)])
def test_grouped_experts_match_a_per_token_reference(T, E, k, hidden, inter, renorm, weights_float32):
    from radixlang_runtime.model.layers.moe import grouped_experts, route

    g = torch.Generator().manual_seed(T * 100 + E)
    x = torch.randn(T, hidden, generator=g, dtype=torch.float64)
    router = torch.randn(E, hidden, generator=g, dtype=torch.float64)
    gate_up = torch.randn(E, 2 * inter, hidden, generator=g, dtype=torch.float64)
    down = torch.randn(E, hidden, inter, generator=g, dtype=torch.float64)
    weights, experts = route(x, router, k, renorm)
    assert weights.dtype == torch.float32 and experts.shape == (T, k)
    got = grouped_experts(x, weights, experts, gate_up, down, weights_float32)
    want = _naive(x, router, gate_up, down, k, renorm, weights_float32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_sparse_block_matches_transformers_qwen2_moe_block():
    """Routing, shared expert and its sigmoid gate against transformers' Qwen2MoeSparseMoeBlock."""
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    from radixlang_runtime.model.layers.moe import SparseMoE
    from radixlang_runtime.model.executor.parallel import make_shard

    hf_cfg = Qwen2MoeConfig(hidden_size=32, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                            num_experts=6, num_experts_per_tok=2, norm_topk_prob=False, vocab_size=64,
                            num_hidden_layers=1, num_attention_heads=4, intermediate_size=40)
    torch.manual_seed(1)
    hf = Qwen2MoeSparseMoeBlock(hf_cfg).eval()
    for p in hf.parameters():
        torch.nn.init.normal_(p, std=0.3)
    cfg = ModelConfig.from_dict({**hf_cfg.to_dict(), "architectures": ["Qwen2MoeForCausalLM"]})
    block = SparseMoE(cfg, make_shard(4, 4, 40, 64), None)
    with torch.no_grad():
        block.router.copy_(hf.gate.weight)
        block.gate_up.copy_(hf.experts.gate_up_proj)
        block.down.copy_(hf.experts.down_proj)
        block.shared.gate_up_proj.weight.copy_(torch.cat([hf.shared_expert.gate_proj.weight,
                                                          hf.shared_expert.up_proj.weight]))
        block.shared.down_proj.weight.copy_(hf.shared_expert.down_proj.weight)
        block.shared_gate.copy_(hf.shared_expert_gate.weight)
        x = torch.randn(1, 11, 32)
        torch.testing.assert_close(block(x[0]), hf(x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tiles", [False, True])
def test_packed_experts_match_the_stacked_weights(dtype, tiles):
    """pack_experts (what pack_for_cpu / quantize_int8 do to a SparseMoE block): each expert's projections become
    the model's packed linears, the stacked parameters are dropped, the block's output is unchanged."""
    from radixlang_runtime.model.layers.moe import SparseMoE
    from radixlang_runtime.model.layers.packed_linear import (PackedLinear, dense_tiles_available, pack_linears,
                                                       packing_available)
    from radixlang_runtime.model.executor.parallel import make_shard

    if not packing_available(torch.device("cpu"), dtype):
        pytest.skip(f"oneDNN has no {dtype} path on this CPU")
    if tiles and not dense_tiles_available(torch.device("cpu"), dtype):
        pytest.skip("no CPU C kernels here")
    cfg = ModelConfig.from_dict({**BASE, "hidden_size": 64, "architectures": ["Qwen2MoeForCausalLM"],
                                 "shared_expert_intermediate_size": 48})
    torch.manual_seed(2)
    block = SparseMoE(cfg, make_shard(4, 4, 128, 100), None)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.2)
    block = block.to(dtype)
    x = torch.randn(9, 64).to(dtype)
    with torch.no_grad():
        want = [block(x[:n]) for n in (1, 2, 9)]  # decode-sized batches and a prefill-sized one
        E = cfg.moe.num_experts
        # as in the model: the block is a child of what pack_for_cpu packs; every expert's two projections and
        # the shared expert's two
        assert pack_linears(torch.nn.ModuleList([block]), tiles) == 2 * E + 2
        assert block.gate_up is None and block.down is None and "gate_up" not in dict(block.named_parameters())
        assert all(isinstance(m, PackedLinear) for pair in block.expert_linears for m in pair)
        got = [block(x[:n]) for n in (1, 2, 9)]
    tol = 2e-5 if dtype == torch.float32 else 2e-2  # float32: oneDNN orders the sums differently from MKL
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------- config.json
BASE = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "max_position_embeddings": 256, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32}


@pytest.mark.parametrize("arch", ["MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
                                  "OlmoeForCausalLM"])
def test_output_router_logits_is_refused_training_fields_are_not(arch):
    cfg = {**BASE, "architectures": [arch]}
    with pytest.raises(ValueError, match="output_router_logits true"):
        ModelConfig.from_dict({**cfg, "output_router_logits": True})
    # training-only: the auxiliary loss's weight, Mixtral's jitter (applied only under module.training)
    spec = ModelConfig.from_dict({**cfg, "router_aux_loss_coef": 0.5, "router_jitter_noise": 0.1,
                                  "output_router_logits": False}).moe
    assert spec is not None and spec.top_k == 2


def test_qwen_sparse_layers_and_refusals():
    qwen2 = {**BASE, "architectures": ["Qwen2MoeForCausalLM"]}
    assert ModelConfig.from_dict({**qwen2, "decoder_sparse_step": 2}).moe.sparse_layers == (False, True, False, True)
    assert ModelConfig.from_dict({**qwen2, "mlp_only_layers": [0, 3]}).moe.sparse_layers == (False, True, True, False)
    assert ModelConfig.from_dict({**qwen2, "num_experts": 0}).moe.sparse_layers == (False,) * 4
    with pytest.raises(ValueError, match="num_experts_per_tok 9"):
        ModelConfig.from_dict({**qwen2, "num_experts_per_tok": 9})
    # windows are served now (every attention path honours them): transformers' layer_types for this config
    # (Qwen2MoeConfig: even layers slide) give the per-layer windows, and a longer context is accepted
    windowed = ModelConfig.from_dict({**qwen2, "use_sliding_window": True, "sliding_window": 64})
    assert windowed.layer_windows == (64, 0, 64, 0)
    windowed.check_context_len(256)
    mixtral = ModelConfig.from_dict({**BASE, "architectures": ["MixtralForCausalLM"], "num_local_experts": 4})
    assert mixtral.moe.num_experts == 4 and mixtral.moe.norm_topk_prob and mixtral.moe.weights_float32
    assert mixtral.rope.theta == 1e6  # MixtralConfig's default
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        ModelConfig.from_dict({**BASE, "architectures": ["OlmoeForCausalLM"], "hidden_act": "gelu"})
