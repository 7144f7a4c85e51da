"""Every family on shapes test_model_families.py does not build: other widths, head counts and ratios (MHA,
GQA, MQA), head dims, layer counts, windows, layer patterns, soft-caps, rope scaling parameters, expert counts
and top-k, and GPT-NeoX (no native file: the transformers fallback) — the same float32 greedy parity against
transformers, with a prompt longer than the window, chunked prefill, retraction under a tight pool, a radix hit
and the first token's logprob (assert_windowed_parity)."""

from __future__ import annotations

import pytest

from test_model_families import assert_windowed_parity

BASE = dict(bos_token_id=1, eos_token_id=2, tie_word_embeddings=True, initializer_range=0.3)


def shape(hidden: int, inter: int, layers: int, heads: int, kv: int, **extra) -> dict:
    return dict(BASE, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, **extra)


# name -> (transformers config class, the model's shape, the family's own fields)
SHAPES = {
    "llama3_gqa2": ("LlamaConfig", shape(96, 160, 3, 6, 3), {"rope_theta": 5000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 16.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
        "original_max_position_embeddings": 24}}),
    "qwen2_yarn_mqa_window": ("Qwen2Config", shape(64, 96, 3, 4, 1), {
        "rope_scaling": {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32},
        "use_sliding_window": True, "sliding_window": 9, "max_window_layers": 2}),
    "mistral_window5": ("MistralConfig", shape(128, 96, 2, 8, 2), {"sliding_window": 5}),
    "gemma2_mha_hd24": ("Gemma2Config", shape(48, 80, 4, 3, 3, initializer_range=0.05), {
        "head_dim": 24, "sliding_window": 6, "query_pre_attn_scalar": 30, "final_logit_softcapping": 20.0,
        "attn_logit_softcapping": 2.0}),
    "gemma3_hd8_pattern3": ("Gemma3TextConfig", shape(48, 64, 5, 6, 2, initializer_range=0.1), {
        "head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 5, "sliding_window_pattern": 3}),
    "phi3_quarter_rotary": ("Phi3Config", shape(96, 64, 2, 6, 2), {"partial_rotary_factor": 0.25,
                                                                   "sliding_window": 7}),
    "mixtral_6x_top3": ("MixtralConfig", shape(64, 24, 2, 4, 4), {"num_local_experts": 6, "num_experts_per_tok": 3,
                                                                 "sliding_window": 6}),
    "qwen2_moe_top1_every2": ("Qwen2MoeConfig", shape(64, 64, 3, 4, 2), {
        "moe_intermediate_size": 24, "num_experts": 6, "num_experts_per_tok": 1, "norm_topk_prob": True,
        "shared_expert_intermediate_size": 40, "decoder_sparse_step": 2}),
    "qwen3_moe_5x_unnormalized": ("Qwen3MoeConfig", shape(80, 64, 2, 5, 1), {
        "head_dim": 16, "moe_intermediate_size": 20, "num_experts": 5, "num_experts_per_tok": 2,
        "norm_topk_prob": False}),
    "olmoe_4x_top3": ("OlmoeConfig", shape(64, 24, 2, 8, 8), {"num_experts": 4, "num_experts_per_tok": 3,
                                                             "clip_qkv": 2.0}),
    "gpt_neox_fallback": ("GPTNeoXConfig", shape(64, 96, 3, 4, 4), {"rotary_pct": 0.5,
                                                                    "use_parallel_residual": False}),
    "gpt_neox_fallback_parallel": ("GPTNeoXConfig", shape(96, 128, 2, 6, 6), {"rotary_pct": 0.25}),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_other_shapes_match_transformers(name, tmp_path):
    cls_name, tiny, kwargs = SHAPES[name]
    assert_windowed_parity(tmp_path, cls_name, kwargs, [], tiny=tiny)
