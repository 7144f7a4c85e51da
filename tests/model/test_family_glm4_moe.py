"""GLM-4.5 MoE (Glm4MoeForCausalLM) end to end: a tiny random checkpoint written by transformers (partial rotary,
q / k norm per head, q/k/v bias, DeepSeek V3's router with a correction bias and groups, shared experts, a dense
first layer), served by the Engine in float32 greedy token for token against transformers' generate, with
prompts longer than a prefill chunk, a retracting pool, a radix-cache hit and the allocator checked after every
step; config fields not honoured refused by name."""

from __future__ import annotations

import pytest
import torch

from radixlang_runtime.model.loader.config import ModelConfig
from tiny_checkpoints import build_tiny, hf_greedy, with_config

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, initializer_range=0.3,
            max_position_embeddings=256, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.0,
            use_qk_norm=True, attention_bias=True)
PROMPTS = [[(i * 131 + 7 * j) % 40000 + 100 for i in range(n)] for j, n in enumerate((20, 37, 44, 9))]
NEW = 10


def test_greedy_matches_transformers(tmp_path):
    from radixlang_runtime import Engine

    model = build_tiny(tmp_path, "Glm4MoeConfig", TINY, {})
    torch.manual_seed(1)
    for m in model.modules():  # a correction bias that moves the choice (transformers initialises zeros)
        if hasattr(m, "e_score_correction_bias"):
            m.e_score_correction_bias.copy_(torch.randn_like(m.e_score_correction_bias) * 0.5)
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert model.config.rope_parameters["partial_rotary_factor"] == 0.5  # transformers' default, not in TINY
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    assert sum(len(set(w)) > 1 for w in want) >= 3  # not a degenerate model (one token repeated)
    whole = {**model.config.rope_parameters, "partial_rotary_factor": 1.0}  # every lane rotating: other tokens
    assert hf_greedy(with_config(model, {"rope_parameters": whole}), PROMPTS[1], NEW) != want[1]
    sp = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
    with Engine(str(tmp_path), dtype="float32", max_total_tokens=128, chunked_prefill_size=16,
                max_prefill_tokens=64, new_token_ratio_init=0.05, new_token_ratio_min=0.05,
                debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=sp)
        stats = eng.get_stats()
        again = eng.generate(input_ids=PROMPTS[2], sampling_params=sp)  # 44 tokens: longer than a chunk
    assert stats["num_retractions"] > 0, "the pool was meant to force retractions"
    assert [o["output_ids"] for o in outs] == want
    assert again["output_ids"] == want[2]
    assert again["meta_info"]["cached_tokens"] > 0


def test_tp2_matches_transformers(tmp_path):
    """Two gloo ranks: the heads, each expert's and the shared experts' intermediate columns split, the router
    (float32, with its correction bias) replicated."""
    from radixlang_runtime import Engine

    model = build_tiny(tmp_path, "Glm4MoeConfig", TINY, {})
    torch.manual_seed(2)
    for m in model.modules():
        if hasattr(m, "e_score_correction_bias"):
            m.e_score_correction_bias.copy_(torch.randn_like(m.e_score_correction_bias) * 0.5)
    model.save_pretrained(tmp_path, safe_serialization=True)
    want = [hf_greedy(model, p, 8) for p in PROMPTS[:2]]
    sp = {"max_new_tokens": 8, "min_new_tokens": 8, "temperature": 0}
    with Engine(str(tmp_path), dtype="float32", tp_size=2, max_total_tokens=1024) as eng:
        outs = eng.generate(input_ids=PROMPTS[:2], sampling_params=sp)
    assert [o["output_ids"] for o in outs] == want


MIN = {"architectures": ["Glm4MoeForCausalLM"], "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "n_routed_experts": 8, "num_experts_per_tok": 2}


def test_partial_rotary_default_and_routing():
    cfg = ModelConfig.from_dict(MIN)
    assert cfg.rope.rotary_dim == 8 and cfg.head_dim == 16  # partial_rotary_factor 0.5 unless given
    assert cfg.moe.sparse_layers == (False, True) and cfg.moe.shared_intermediate_size == 1408
    assert cfg.moe.routing.scoring == "sigmoid" and cfg.moe.routing.correction_bias


@pytest.mark.parametrize("extra,needle", [
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"topk_method": "greedy"}, "topk_method"),
    ({"n_group": 8}, "n_group"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"output_router_logits": True}, "output_router_logits"),
])
def test_unhonoured_fields_are_refused_by_name(extra, needle):
    with pytest.raises(ValueError, match=needle):
        ModelConfig.from_dict({**MIN, **extra})
