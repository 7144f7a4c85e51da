"""Model families and RoPE variants end to end: tiny random checkpoints written by transformers, served by
the Engine in float32, greedy token for token against transformers' own generate on the same weights;
config fields the runtime does not honour are refused by name."""

from __future__ import annotations

import pytest

from radixlang_runtime.model.loader.config import ModelConfig
from tiny_checkpoints import build_tiny, hf_greedy, with_config

PROMPTS = [list(range(300, 320)), [5, 77, 1200, 9, 4000, 31]]  # token ids (the embedded tokenizer's vocab)
NEW = 24
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3)  # large weights: positions move the logits a lot

# name -> (transformers config class, its kwargs, Engine kwargs, the rope_parameters of a contrast model: the
# same weights with that RoPE must give other tokens, so the comparison can fail)
PLAIN = {"rope_type": "default", "rope_theta": 10000.0}
SHORT, LONG = [1.0 + 0.1 * i for i in range(8)], [2.0 + 0.5 * i for i in range(8)]
PHI3_LONGROPE = {"max_position_embeddings": 128, "original_max_position_embeddings": 32, "num_attention_heads": 2,
                 "num_key_value_heads": 1, "partial_rotary_factor": 0.5,
                 "rope_scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG}}
CASES = {
    "llama3": ("LlamaConfig", {"max_position_embeddings": 256, "rope_theta": 10000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}}, {}, PLAIN),
    "qwen2_yarn": ("Qwen2Config", {"max_position_embeddings": 256, "rope_theta": 10000.0, "rope_scaling": {
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}}, {}, PLAIN),
    "llama_linear": ("LlamaConfig", {"max_position_embeddings": 256, "rope_theta": 10000.0,
                                     "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, {}, PLAIN),
    # 20-token prompt inside the 32-position window, then decoding past it: the NTK base grows per position
    "llama_dynamic": ("LlamaConfig", {"max_position_embeddings": 32, "rope_theta": 10000.0,
                                      "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}},
                      {"context_length": 128}, PLAIN),
    # sliding_window (4096) >= the context (256): a no-op, accepted
    "mistral_long_window": ("MistralConfig", {"max_position_embeddings": 256, "sliding_window": 4096}, {}, None),
    # partial rotary (16 of 32 lanes; the C rope kernels rotate whole heads: Rotary.apply runs) ...
    "phi3_partial": ("Phi3Config", {"max_position_embeddings": 256, "num_attention_heads": 2,
                                    "num_key_value_heads": 1, "partial_rotary_factor": 0.5}, {},
                     {**PLAIN, "partial_rotary_factor": 1.0}),
    # ... with longrope (short factors: Phi-3 is served inside its original window, see below)
    "phi3_longrope": ("Phi3Config", PHI3_LONGROPE, {"context_length": 32}, {**PLAIN, "partial_rotary_factor": 0.5}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_matches_transformers(name, tmp_path):
    from radixlang_runtime import Engine

    cls_name, kwargs, engine_kwargs, contrast = CASES[name]
    model = build_tiny(tmp_path, cls_name, TINY, kwargs)
    new = min(NEW, engine_kwargs.get("context_length", 1024) - max(map(len, PROMPTS)))
    want = [hf_greedy(model, p, new) for p in PROMPTS]
    if contrast is not None:  # the RoPE variant changes transformers' own tokens: the comparison can fail
        assert [hf_greedy(with_config(model, {"rope_parameters": dict(contrast)}), p, new) for p in PROMPTS] != want
    with Engine(str(tmp_path), dtype="float32", max_total_tokens=1024, **engine_kwargs) as eng:
        sp = {"max_new_tokens": new, "min_new_tokens": new, "temperature": 0}
        outs = eng.generate(input_ids=PROMPTS, sampling_params=sp)
        again = eng.generate(input_ids=PROMPTS[0], sampling_params=sp)  # prefix-cache hit: same tokens
    assert [o["output_ids"] for o in outs] == want
    assert again["output_ids"] == want[0]
    assert again["meta_info"]["cached_tokens"] > 0


def test_phi3_longrope_past_its_original_window_is_refused(tmp_path):
    from radixlang_runtime import Engine

    build_tiny(tmp_path, "Phi3Config", TINY, PHI3_LONGROPE)
    with pytest.raises(ValueError, match="longrope on Phi3ForCausalLM .* original_max_position_embeddings 32"):
        Engine(str(tmp_path), dtype="float32", max_total_tokens=1024)  # context 128


def test_a_llama_attention_output_bias_is_refused_by_name(tmp_path):
    """transformers' Llama with attention_bias true biases o_proj too: refused at load, not dropped."""
    from radixlang_runtime import Engine

    build_tiny(tmp_path, "LlamaConfig", TINY, {"attention_bias": True})
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.o_proj\.bias: an attention output bias"):
        Engine(str(tmp_path), dtype="float32", max_total_tokens=1024)


BASE = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 256}


@pytest.mark.parametrize("extra,needle", [
    # OLMoE: transformers builds a plain causal mask yet passes the window to flash attention: ambiguous
    ({"architectures": ["OlmoeForCausalLM"], "sliding_window": 64, "num_experts": 4, "num_experts_per_tok": 2},
     "sliding_window 64 .*flash attention only"),
    ({"architectures": ["MistralForCausalLM"], "sliding_window": 0}, "sliding_window 0 must be a positive"),
    ({"architectures": ["Qwen2ForCausalLM"], "layer_types": ["full_attention"]}, "layer_types has 1 entries"),
    ({"layer_types": ["full_attention", "chunked_attention"]}, "layer_types entry 'chunked_attention'"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, r"quantization_config \(bitsandbytes\)"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"rope_scaling": {"rope_type": "mrope", "factor": 2.0}}, "rope_type 'mrope'"),
    ({"architectures": ["GPT2LMHeadModel"]}, "unsupported architecture 'GPT2LMHeadModel'"),
    ({"architectures": ["Olmo2ForCausalLM"], "attention_bias": True}, "attention_bias true .*Olmo2ForCausalLM"),
    ({"architectures": ["Olmo3ForCausalLM"], "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
     "rope_parameters entry 'rope_theta' .*Olmo3ForCausalLM"),
    ({"architectures": ["Olmo3ForCausalLM"], "rope_scaling": {"rope_type": "mrope"}}, "rope_type 'mrope'"),
    ({"architectures": ["Olmo3ForCausalLM"], "layer_types": ["full_attention"]}, "layer_types has 1 entries"),
])
def test_unhonoured_fields_are_refused_by_name(extra, needle):
    cfg = {**BASE, **extra}
    with pytest.raises(ValueError, match=needle):
        ModelConfig.from_dict(cfg).check_context_len(256)


@pytest.mark.parametrize("extra", [
    {"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False, "sliding_window": 64},  # off: ignored
    {"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 64,
     "max_window_layers": 2},  # no layer at or above max_window_layers: no sliding layer
    {"architectures": ["MistralForCausalLM"], "sliding_window": None},
    {"architectures": ["MistralForCausalLM"], "sliding_window": 256},  # window == context: never masks
    {"layer_types": ["full_attention", "full_attention"], "attn_logit_softcapping": None},
])
def test_no_op_fields_are_accepted(extra):
    cfg = ModelConfig.from_dict({**BASE, **extra})
    cfg.check_context_len(256)
    assert cfg.layer_windows in ((), (256, 256))  # a window >= the context masks nothing


@pytest.mark.parametrize("extra,windows", [
    ({"architectures": ["MistralForCausalLM"]}, (4096, 4096)),  # MistralConfig's default window, every layer
    ({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 64,
      "max_window_layers": 1}, (0, 64)),  # layers >= max_window_layers
    ({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 64,
      "layer_types": ["sliding_attention", "full_attention"]}, (64, 0)),  # layer_types win
    ({"architectures": ["Qwen3ForCausalLM"], "use_sliding_window": True, "sliding_window": 128,
      "max_window_layers": 0}, (128, 128)),
])
def test_sliding_windows_per_layer(extra, windows):
    assert ModelConfig.from_dict({**BASE, **extra}).layer_windows == windows


# Sliding windows served end to end: prompts longer than the window, chunked prefill (chunks of 16), a pool
# so tight that decode retracts, then a radix-cache hit; every request token for token against transformers.
# name -> (config class, kwargs, the contrast config changes: each must give other tokens, so each feature counts)
FULL = "full_attention"
GEMMA3_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
               "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}
WINDOWED = {
    "mistral_window": ("MistralConfig", {"sliding_window": 8}, [{"sliding_window": None}]),
    "qwen2_window": ("Qwen2Config", {"num_hidden_layers": 3, "num_key_value_heads": 1, "use_sliding_window": True,
                                     "sliding_window": 12, "max_window_layers": 1}, [{"layer_types": [FULL] * 3}]),
    # Gemma 2: even layers slide by default; soft-caps small enough to bend the scores and the logits
    "gemma2_a": ("Gemma2Config", {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 8,
                                  "initializer_range": 0.05, "final_logit_softcapping": 3.0,
                                  "attn_logit_softcapping": 0.5},
                 [{"layer_types": [FULL] * 2}, {"attn_logit_softcapping": None}]),  # final cap: the logprob check
    "gemma2_b": ("Gemma2Config", {"num_hidden_layers": 3, "num_key_value_heads": 1, "head_dim": 32,
                                  "intermediate_size": 96, "query_pre_attn_scalar": 24, "sliding_window": 12,
                                  "initializer_range": 0.05, "final_logit_softcapping": 5.0,
                                  "attn_logit_softcapping": 3.0}, [{"layer_types": [FULL] * 3}]),
    # Gemma 3 text: qk-norm, every 2nd (a) / explicit (b) global layer, local rope theta of its own
    "gemma3_a": ("Gemma3TextConfig", {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 8,
                                      "initializer_range": 0.1, "num_hidden_layers": 3, "sliding_window_pattern": 2},
                 [{"layer_types": [FULL] * 3}]),
    "gemma3_b": ("Gemma3TextConfig", {"num_hidden_layers": 4, "num_key_value_heads": 4, "head_dim": 32,
                                      "query_pre_attn_scalar": 32, "sliding_window": 11, "initializer_range": 0.1,
                                      "layer_types": ["sliding_attention", "sliding_attention", FULL,
                                                      "sliding_attention"],
                                      "rope_parameters": GEMMA3_ROPE, "final_logit_softcapping": 8.0},
                 [{"rope_parameters": {**GEMMA3_ROPE, "sliding_attention": GEMMA3_ROPE["full_attention"]}}]),
}
# windows in the MoE and Phi-3 families (the same decoder's window, their own blocks around it)
WINDOWED.update({
    "mixtral_window": ("MixtralConfig", {"sliding_window": 8, "intermediate_size": 32, "num_local_experts": 4,
                                         "num_experts_per_tok": 2}, [{"sliding_window": None}]),
    "phi3_window": ("Phi3Config", {"sliding_window": 10, "partial_rotary_factor": 0.5},
                    [{"sliding_window": None}]),
    # Qwen2-MoE: layers below max_window_layers slide (layer_types), layer 0 dense, layer 1 sparse + shared expert
    "qwen2_moe_window": ("Qwen2MoeConfig", {"num_hidden_layers": 3, "intermediate_size": 96,
                                            "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
                                            "shared_expert_intermediate_size": 48, "mlp_only_layers": [0],
                                            "use_sliding_window": True, "sliding_window": 12,
                                            "max_window_layers": 2}, [{"layer_types": [FULL] * 3}]),
})
# OLMo 2 / 3: post-norms only, q / k normed over the whole projection; OLMo 3's sliding layers with a rope of their
# own (yarn on the full ones). Served as the windowed families are (chunked prefill, retractions, a cache hit).
OLMO3_ROPE = {"full_attention": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                 "rope_theta": 10000.0},
              "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}
OLMO = {
    "olmo2": ("Olmo2Config", {"initializer_range": 0.1, "rope_theta": 10000.0},
              [{"rope_parameters": {"rope_type": "default", "rope_theta": 100.0}}]),
    "olmo3": ("Olmo3Config", {"num_hidden_layers": 4, "sliding_window": 8, "initializer_range": 0.1,
                              "rope_parameters": OLMO3_ROPE},  # default layer_types: layer 3 full
              [{"layer_types": [FULL] * 4}, {"sliding_window": 4096},
               {"rope_parameters": {**OLMO3_ROPE, "sliding_attention": OLMO3_ROPE["full_attention"]}},
               {"rope_parameters": {**OLMO3_ROPE, "full_attention": OLMO3_ROPE["sliding_attention"]}}]),
}
LONG_PROMPTS = [[(i * 131 + 7 * j) % 40000 + 100 for i in range(n)] for j, n in enumerate((20, 37, 26, 44, 31, 9))]


def assert_windowed_parity(tmp_path, cls_name: str, kwargs: dict, contrasts: list[dict], new: int = 16,
                           tiny: dict = TINY) -> None:
    from radixlang_runtime import Engine

    model = build_tiny(tmp_path, cls_name, tiny, {"max_position_embeddings": 256, **kwargs})
    want = [hf_greedy(model, p, new) for p in LONG_PROMPTS]
    assert sum(len(set(w)) > 1 for w in want) >= 3  # not a degenerate model (one token repeated)
    for contrast in contrasts:  # the window / layer pattern / cap / rope matters to transformers' own tokens
        other = with_config(model, contrast)
        assert [hf_greedy(other, p, new) for p in LONG_PROMPTS] != want, contrast
    sp = {"max_new_tokens": new, "min_new_tokens": new, "temperature": 0}
    with Engine(str(tmp_path), dtype="float32", max_total_tokens=160, chunked_prefill_size=16,
                max_prefill_tokens=64, new_token_ratio_init=0.05, new_token_ratio_min=0.05,
                debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=LONG_PROMPTS, sampling_params=sp)
        assert eng.get_stats()["num_retractions"] > 0, "the pool was meant to force retractions"
        again = eng.generate(input_ids=LONG_PROMPTS[3], sampling_params=sp)
        first = eng.generate(input_ids=LONG_PROMPTS[3], sampling_params={**sp, "max_new_tokens": 1,
                                                                         "min_new_tokens": 1}, return_logprob=True)
    assert [o["output_ids"] for o in outs] == want
    assert again["output_ids"] == want[3] and again["meta_info"]["cached_tokens"] > 0
    # the first token's logprob: transformers' (final logit soft-cap included, which greedy ids cannot show)
    import torch

    with torch.no_grad():
        ref = model(torch.tensor([LONG_PROMPTS[3]])).logits[0, -1].float().log_softmax(-1)[want[3][0]].item()
    assert abs(first["meta_info"]["output_token_logprobs"][0][0] - ref) < 1e-4


@pytest.mark.parametrize("name", sorted(WINDOWED))
def test_sliding_window_families_match_transformers(name, tmp_path):
    assert_windowed_parity(tmp_path, *WINDOWED[name])


def test_gemma3_returns_transformers_final_hidden_states(tmp_path):
    """Gemma 3 sets its local rope tables where the hidden states are computed: --enable-return-hidden-states gives
    transformers' final-norm output over a prompt past the sliding window (sliding and global layers, two ropes)."""
    import torch

    from radixlang_runtime import Engine

    cls_name, kwargs, _ = WINDOWED["gemma3_b"]
    model = build_tiny(tmp_path, cls_name, TINY, {"max_position_embeddings": 256, **kwargs})
    ids = LONG_PROMPTS[3]
    assert len(ids) > kwargs["sliding_window"]
    sp = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}
    with Engine(str(tmp_path), dtype="float32", max_total_tokens=512, enable_return_hidden_states=True) as eng:
        out = eng.generate(input_ids=ids, sampling_params=sp, return_hidden_states=True)
    hs = out["meta_info"]["hidden_states"]
    got = torch.tensor([*hs[0], *hs[1:]])  # the prompt's rows, then one per generated token but the last
    with torch.no_grad():
        want = model.model(torch.tensor([ids + out["output_ids"][:-1]])).last_hidden_state[0]
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    assert out["output_ids"] == hf_greedy(model, ids, 3)


@pytest.mark.parametrize("name", sorted(OLMO))
def test_olmo_families_match_transformers(name, tmp_path):
    assert_windowed_parity(tmp_path, *OLMO[name])


@pytest.mark.parametrize("cls_name,fused", [("Olmo2Config", False), ("LlamaConfig", True)])
def test_olmo_steps_aside_from_the_fused_decode_layer(cls_name, fused, tmp_path):
    """The whole-projection q / k norms and the post-norm layers run on the modules (the parity tests above
    serve that path); a Llama of the same shape takes the fused decode layer (the check can fail)."""
    from radixlang_runtime import Engine

    build_tiny(tmp_path, cls_name, TINY, {"max_position_embeddings": 256})
    with Engine(str(tmp_path), dtype="float32", max_total_tokens=256) as eng:
        assert (eng.runner.model.fused_decode is not None) == fused, eng.runner.cpu_paths


@pytest.mark.parametrize("extra", [
    {},
    {"rope_theta": 10000.0},  # the older keys: the full layers' theta; the sliding ones keep default_theta
    {"rope_theta": 1000.0, "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
                                            "attention_factor": 1.2, "beta_fast": 32, "beta_slow": 1}},
    {"rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}},
    {"rope_parameters": OLMO3_ROPE},
])
def test_olmo3_rope_per_layer_type_as_transformers_builds_it(extra):
    import transformers

    hf = transformers.Olmo3Config(**{k: v for k, v in BASE.items() if k != "architectures"}, **extra)
    cfg = ModelConfig.from_dict({**BASE, "architectures": ["Olmo3ForCausalLM"], **extra})
    for spec, want in ((cfg.rope, hf.rope_parameters["full_attention"]),
                       (cfg.rope_local, hf.rope_parameters["sliding_attention"])):
        assert (spec.rope_type, spec.theta) == (want["rope_type"], want["rope_theta"])
        assert spec.factor == want.get("factor")
    assert cfg.layer_windows == tuple(4096 if t == "sliding_attention" else 0 for t in hf.layer_types)


def test_phi3_su_is_longrope_and_fused_rows_map_to_llama_names():
    import torch

    from radixlang_runtime.model.models.phi3 import FusedPhi3Tensors

    half = 8  # head_dim 16 (64 / 4) -> rotary 16 -> 8 factors
    cfg = ModelConfig.from_dict({**BASE, "architectures": ["Phi3ForCausalLM"], "num_key_value_heads": 2,
                                 "rope_scaling": {"type": "su", "short_factor": [1.0] * half,
                                                  "long_factor": [2.0] * half}})
    assert cfg.rope.rope_type == "longrope" and cfg.rope.original_max_position_embeddings == 4096
    cfg.check_context_len(4096)
    with pytest.raises(ValueError, match="longrope on Phi3ForCausalLM"):
        cfg.check_context_len(4097)

    class Fake:  # SafetensorsDir.get over a dict
        def __init__(self, d):
            self.d = d

        def get(self, name, rows=None, cols=None):
            t = self.d[name]
            t = t if rows is None else t[rows[0]:rows[1]]
            return t if cols is None else t[:, cols[0]:cols[1]]

    qkv = torch.arange((64 + 2 * 32) * 3).reshape(128, 3)  # q 4 x 16 rows, k and v 2 x 16 rows each
    gate_up = torch.arange(2 * 128 * 3).reshape(256, 3)
    view = FusedPhi3Tensors(Fake({"model.layers.1.self_attn.qkv_proj.weight": qkv,
                                  "model.layers.1.mlp.gate_up_proj.weight": gate_up}), cfg)
    a = "model.layers.1.self_attn."
    assert torch.equal(view.get(a + "q_proj.weight"), qkv[:64])
    assert torch.equal(view.get(a + "k_proj.weight", rows=(16, 32)), qkv[80:96])  # a TP rank's second KV head
    assert torch.equal(view.get(a + "v_proj.weight"), qkv[96:])
    assert torch.equal(view.get("model.layers.1.mlp.up_proj.weight", rows=(0, 64), cols=(1, 3)), gate_up[128:192, 1:])
    assert torch.equal(view.get("model.layers.1.mlp.gate_proj.weight"), gate_up[:128])
