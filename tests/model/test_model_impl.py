"""--model-impl: an architecture with no native file (GPT-NeoX) served through transformers' modeling code with
attention in the paged KV pool (models/transformers_fallback.py), greedy token for token against transformers'
own generate in float32, with a radix-cache hit and a chunked prefill; a Llama checkpoint gives the same tokens
through either implementation; what the fallback cannot route is refused by name."""

from __future__ import annotations

import re

import pytest

from radixlang_runtime.model.loader.config import ModelConfig
from tiny_checkpoints import build_tiny, hf_greedy

PROMPTS = [list(range(300, 320)), [5, 77, 1200, 9, 4000, 31]]  # token ids (the embedded tokenizer's vocab)
NEW = 12
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, bos_token_id=1,
            eos_token_id=2, initializer_range=0.3, max_position_embeddings=256)


def test_gpt_neox_falls_back_to_transformers(tmp_path, caplog):
    import torch

    from radixlang_runtime import Engine

    # partial rotary (GPT-NeoX's rotary_pct), untied head: transformers' code does both
    model = build_tiny(tmp_path, "GPTNeoXConfig", TINY, {"rotary_pct": 0.5, "tie_word_embeddings": False})
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    with pytest.raises(ValueError, match="unsupported architecture 'GPTNeoXForCausalLM'"):
        ModelConfig.from_dir(str(tmp_path), "native")
    caplog.set_level("INFO", logger="radixlang_runtime.model.executor.runner")
    # chunks of 8 tokens (pages of 4): the 20-token prompt prefills in three steps
    with Engine(str(tmp_path), dtype="float32", max_total_tokens=1024, page_size=4, chunked_prefill_size=8) as eng:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=SP)
        again = eng.generate(input_ids=PROMPTS[0], sampling_params=SP)  # prefix-cache hit: same tokens
        scored = eng.generate(input_ids=PROMPTS[0], sampling_params=SP, return_logprob=True)
        digits = eng.generate(input_ids=PROMPTS[1], sampling_params={**SP, "regex": "[0-9]{5}", "min_new_tokens": 0})
    assert "GPTNeoXForCausalLM (transformers implementation)" in caplog.text
    assert [o["output_ids"] for o in outs] == want
    assert again["output_ids"] == want[0]
    assert again["meta_info"]["cached_tokens"] > 0
    with torch.no_grad():  # the logprobs are transformers' log-softmax at the same positions
        ref = torch.log_softmax(model(torch.tensor([PROMPTS[0] + want[0]])).logits[0].float(), -1)
    lps = scored["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lps] == want[0]
    for j, (lp, tok, _) in enumerate(lps):
        assert abs(lp - ref[len(PROMPTS[0]) - 1 + j, tok].item()) < 1e-3
    assert re.fullmatch("[0-9]{5}", digits["text"])  # constrained decoding on the fallback's logits


def test_llama_through_transformers_matches_native(tmp_path):
    from radixlang_runtime import Engine

    model = build_tiny(tmp_path, "LlamaConfig", TINY, {"num_key_value_heads": 2, "tie_word_embeddings": True})
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    got = {}
    for impl in ("transformers", "native"):
        with Engine(str(tmp_path), dtype="float32", max_total_tokens=1024, model_impl=impl) as eng:
            got[impl] = [o["output_ids"] for o in eng.generate(input_ids=PROMPTS, sampling_params=SP)]
    assert got["transformers"] == want
    assert got["native"] == want


def test_softcapping_is_refused_before_loading(tmp_path):
    """Gemma 2 through transformers: its attention soft-caps, which the paged routing does not apply."""
    from radixlang_runtime import Engine

    build_tiny(tmp_path, "Gemma2Config", TINY, {"num_key_value_heads": 2, "head_dim": 16, "query_pre_attn_scalar": 16,
                                                "sliding_window": 4096})
    with pytest.raises(ValueError, match="Gemma2ForCausalLM cannot run with --model-impl transformers: "
                                         r"attn_logit_softcapping 50.0 \(attention logit soft-capping\)"):
        Engine(str(tmp_path), dtype="float32", max_total_tokens=1024, model_impl="transformers")


def test_what_the_fallback_cannot_route_is_refused():
    from transformers import GPTNeoConfig, MistralConfig

    neo = {**GPTNeoConfig(vocab_size=100).to_dict(), "architectures": ["GPTNeoForCausalLM"]}
    with pytest.raises(ValueError, match="'GPTNeoForCausalLM': its attention is not reachable through transformers' "
                                         "attention-function registry"):
        ModelConfig.from_dict(neo, "auto")
    mistral = {**MistralConfig(vocab_size=100, sliding_window=16, max_position_embeddings=256).to_dict(),
               "architectures": ["MistralForCausalLM"]}
    with pytest.raises(ValueError, match=r"sliding_window 16 \(--model-impl transformers attends over the whole "
                                         r"prefix\): context length 256 is refused"):
        ModelConfig.from_dict(mistral, "transformers").check_context_len(256)
    with pytest.raises(ValueError, match="model_impl 'hf': choose one of auto, native, transformers"):
        ModelConfig.from_dict(mistral, "hf")


def test_attention_function_needs_a_bound_step():
    import torch

    from radixlang_runtime.model.models import transformers_fallback as tf

    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="outside a radixlang forward"):
        tf.paged_attention(torch.nn.Module(), q, q, q, None)
    step = tf._Step(None, None, None)
    with tf._bind(step):
        with pytest.raises(RuntimeError, match="nesting refused"):
            with tf._bind(step):
                pass
