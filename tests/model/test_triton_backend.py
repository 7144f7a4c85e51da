"""The Engine on a tiny random Llama gives the same greedy tokens with the Triton backend
(interpreted on CPU) as with the torch backend, through prefill, prefix-cache hits and decode."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    path = tmp_path_factory.mktemp("tiny-llama")
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
                      initializer_range=0.3)  # large weights: attention moves the logits a lot
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return str(path)


def run(model_dir: str, backend: str) -> tuple[list[list[int]], list[list[float]]]:
    from radixlang_runtime import Engine

    prefix = list(range(300, 340))
    prompts = [prefix + [7, 8, 9], prefix + [10], list(range(1000, 1003)), [5]]
    with Engine(model_dir, dtype="float32", attention_backend=backend, max_total_tokens=2048, page_size=16,
                debug_check_integrity=True) as eng:
        sp = {"max_new_tokens": 6, "min_new_tokens": 6, "temperature": 0}
        first = eng.generate(input_ids=prompts[0], sampling_params=sp, return_logprob=True)  # caches the prefix
        # positions >= 36 must be computed for their logprobs: the cache serves 32 (two pages of 16)
        rest = eng.generate(input_ids=prompts[1:], sampling_params=sp, return_logprob=True,
                            logprob_start_len=[36, 0, 0])
        assert rest[0]["meta_info"]["cached_tokens"] == 32  # prefix-cache hit: extend over a pooled prefix
        outs = [first] + rest
        # every prompt position's logprob (extend) and every output token's (decode after the first)
        lps = [[e[0] for e in o["meta_info"]["input_token_logprobs"][1:] + o["meta_info"]["output_token_logprobs"]]
               for o in outs]
        return [o["output_ids"] for o in outs], lps


def test_triton_backend_matches_torch_backend(tiny_model_dir):
    tokens, lps = run(tiny_model_dir, "triton")
    ref_tokens, ref_lps = run(tiny_model_dir, "torch")
    assert tokens == ref_tokens
    for a, b in zip(lps, ref_lps):
        assert len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) < 1e-4
