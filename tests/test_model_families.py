"""Model families and RoPE variants end to end: tiny random checkpoints written by transformers, served by
the Engine in float32, greedy token for token against transformers' own generate on the same weights;
config fields the runtime does not honour are refused by name."""

from __future__ import annotations

import pytest

from radixlang_runtime.model.config import ModelConfig

PROMPTS = [list(range(300, 320)), [5, 77, 1200, 9, 4000, 31]]  # token ids (the embedded tokenizer's vocab)
NEW = 24
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3)  # large weights: positions move the logits a lot

# name -> (transformers config class, its kwargs, Engine kwargs)
CASES = {
    "llama3": ("LlamaConfig", {"max_position_embeddings": 256, "rope_theta": 10000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}}, {}),
    "qwen2_yarn": ("Qwen2Config", {"max_position_embeddings": 256, "rope_theta": 10000.0, "rope_scaling": {
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}}, {}),
    "llama_linear": ("LlamaConfig", {"max_position_embeddings": 256, "rope_theta": 10000.0,
                                     "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, {}),
    # 20-token prompt inside the 32-position window, then decoding past it: the NTK base grows per position
    "llama_dynamic": ("LlamaConfig", {"max_position_embeddings": 32, "rope_theta": 10000.0,
                                      "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}},
                      {"context_length": 128}),
    # sliding_window (4096) >= the context (256): a no-op, accepted
    "mistral_long_window": ("MistralConfig", {"max_position_embeddings": 256, "sliding_window": 4096}, {}),
}


def _build(tmp_path, cls_name: str, kwargs: dict):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radixlang_runtime.model.resolve import resolve_model_dir

    tok = AutoTokenizer.from_pretrained(resolve_model_dir(None))
    cfg = getattr(transformers, cls_name)(vocab_size=len(tok), **TINY, **kwargs)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    tok.save_pretrained(tmp_path)
    return model


def _hf_greedy(model, ids: list[int], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=2)
    return out[0, len(ids):].tolist()


def _without_scaling(model):
    """The same weights with plain RoPE (to show the scaled model's tokens depend on the scaling)."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(model.config)
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": cfg.rope_parameters["rope_theta"]}
    plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    plain.load_state_dict(model.state_dict())
    return plain


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_matches_transformers(name, tmp_path):
    from radixlang_runtime import Engine

    cls_name, kwargs, engine_kwargs = CASES[name]
    model = _build(tmp_path, cls_name, kwargs)
    want = [_hf_greedy(model, p, NEW) for p in PROMPTS]
    if "rope_scaling" in kwargs:  # the scaling changes transformers' own tokens: the comparison can fail
        plain = _without_scaling(model)
        assert [_hf_greedy(plain, p, NEW) for p in PROMPTS] != want
    with Engine(str(tmp_path), dtype="float32", max_total_tokens=1024, **engine_kwargs) as eng:
        sp = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
        outs = eng.generate(input_ids=PROMPTS, sampling_params=sp)
        again = eng.generate(input_ids=PROMPTS[0], sampling_params=sp)  # prefix-cache hit: same tokens
    assert [o["output_ids"] for o in outs] == want
    assert again["output_ids"] == want[0]
    assert again["meta_info"]["cached_tokens"] > 0


def test_mistral_short_sliding_window_is_refused(tmp_path):
    from radixlang_runtime import Engine

    _build(tmp_path, "MistralConfig", {"max_position_embeddings": 256, "sliding_window": 16})
    with pytest.raises(ValueError, match="sliding_window 16 is shorter than the context length 256"):
        Engine(str(tmp_path), dtype="float32", max_total_tokens=1024)


BASE = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 256}


@pytest.mark.parametrize("extra,needle", [
    ({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 64,
      "max_window_layers": 1}, "sliding_window 64"),
    ({"architectures": ["Qwen3ForCausalLM"], "use_sliding_window": True, "sliding_window": 128,
      "max_window_layers": 0}, "sliding_window 128"),
    ({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 64,
      "layer_types": ["full_attention", "sliding_attention"]}, "sliding_window 64"),
    ({"architectures": ["MistralForCausalLM"]}, "sliding_window 4096 is shorter than the context length 8192"),
    ({"layer_types": ["full_attention", "chunked_attention"]}, "layer_types entry 'chunked_attention'"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"quantization_config": {"quant_method": "awq"}}, r"quantization_config \(awq\)"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"rope_scaling": {"rope_type": "mrope", "factor": 2.0}}, "rope_type 'mrope'"),
    ({"architectures": ["GPT2LMHeadModel"]}, "unsupported architecture 'GPT2LMHeadModel'"),
])
def test_unhonoured_fields_are_refused_by_name(extra, needle):
    cfg = {**BASE, **extra}
    context = 8192 if extra.get("architectures") == ["MistralForCausalLM"] else 256
    with pytest.raises(ValueError, match=needle):
        ModelConfig.from_dict(cfg).check_context_len(context)


@pytest.mark.parametrize("extra", [
    {"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False, "sliding_window": 64},  # off: ignored
    {"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 64,
     "max_window_layers": 2},  # no layer at or above max_window_layers: no sliding layer
    {"architectures": ["MistralForCausalLM"], "sliding_window": None},
    {"architectures": ["MistralForCausalLM"], "sliding_window": 256},  # window == context: never masks
    {"layer_types": ["full_attention", "full_attention"], "attn_logit_softcapping": None},
])
def test_no_op_fields_are_accepted(extra):
    ModelConfig.from_dict({**BASE, **extra}).check_context_len(256)
