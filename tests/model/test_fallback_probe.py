"""The transformers fallback's load-time gates (models/fallback_probe.py): a checkpoint the paged routing serves
right passes the parity probe (its figures reported); Llama 4's chunked local attention is refused from
config.json by name, and when that gate is bypassed the parity probe itself finds the layer that differs;
config features the routing cannot represent are refused before anything runs."""

from __future__ import annotations

import pytest

from radixlang_runtime.model.loader.config import ModelConfig
from tiny_checkpoints import build_tiny

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            bos_token_id=1, eos_token_id=2, initializer_range=0.3, max_position_embeddings=256)
# Llama 4 text: RoPE layers 0-2 attend in chunks of 8 (the probe prompt is longer), layer 3 NoPE and global
LLAMA4 = dict(hidden_size=64, intermediate_size=32, intermediate_size_mlp=128, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
              interleave_moe_layer_step=2, attention_chunk_size=8, bos_token_id=1, eos_token_id=2,
              initializer_range=0.1, max_position_embeddings=256)


def load_fallback(path, dtype_name: str = "float32"):
    """The fallback model class as the runner builds it (CPU, the torch attention backend)."""
    import torch

    from radixlang_runtime.model.layers.attention import create_attention_backend
    from radixlang_runtime.model.models.transformers_fallback import TransformersForCausalLM
    from radixlang_runtime.model.loader.weights import SafetensorsDir

    cfg = ModelConfig.from_dir(str(path), "transformers")
    backend = create_attention_backend("torch", cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                       cfg.head_dim ** -0.5)
    model = TransformersForCausalLM(cfg, backend, None).to(getattr(torch, dtype_name))
    model.load_hf_state_dict(SafetensorsDir(str(path)))
    return model


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_a_checkpoint_served_right_passes_and_reports(tmp_path, dtype_name):
    """bfloat16: the probe runs the layers in float32 and leaves the model in its dtype."""
    import torch

    build_tiny(tmp_path, "GPTNeoXConfig", TINY, {"rotary_pct": 0.5})
    model = load_fallback(tmp_path, dtype_name)
    assert {p.dtype for p in model.hf.parameters()} == {getattr(torch, dtype_name)}
    report = model.probe_report
    assert report.layers == 2 and report.tokens == 24
    assert report.max_abs_diff < 1e-4
    assert report.seconds > 0
    assert "2 layers x 24 tokens in float32" in report.describe()


def test_llama4_chunked_attention_is_refused_from_its_config(tmp_path):
    build_tiny(tmp_path, "Llama4TextConfig", LLAMA4, {})
    with pytest.raises(ValueError, match=r"Llama4ForCausalLM cannot run with --model-impl transformers: layer 0 is "
                                         r"'chunked_attention' \(attention_chunk_size 8\)"):
        ModelConfig.from_dir(str(tmp_path), "transformers")


def test_the_probe_finds_the_layer_that_differs(tmp_path, monkeypatch):
    """The config gate bypassed: the routing attends over the whole prefix where Llama 4's layer 0 attends in
    chunks of 8, and the probe's 24 tokens show it."""
    from radixlang_runtime.model.models import transformers_fallback

    build_tiny(tmp_path, "Llama4TextConfig", LLAMA4, {})
    monkeypatch.setattr(transformers_fallback, "refuse_unroutable", lambda text, arch: None)
    with pytest.raises(ValueError, match=r"Llama4ForCausalLM cannot run with --model-impl transformers: the parity "
                                         r"probe \(24 tokens, float32\) found layer 0's output .* max abs "
                                         r"difference [0-9.e-]+"):
        load_fallback(tmp_path)


def test_the_probe_would_pass_llama4_without_chunks(tmp_path, monkeypatch):
    """The same model with chunks longer than the probe prompt: the routing and transformers agree (so the
    refusal above is the chunking, not the probe)."""
    from radixlang_runtime.model.models import transformers_fallback

    build_tiny(tmp_path, "Llama4TextConfig", {**LLAMA4, "attention_chunk_size": 64}, {})
    monkeypatch.setattr(transformers_fallback, "refuse_unroutable", lambda text, arch: None)
    assert load_fallback(tmp_path).probe_report.max_abs_diff < 1e-4


@pytest.mark.parametrize("extra,needle", [
    ({"layer_types": ["full_attention", "chunked_attention"]}, "layer 1 is 'chunked_attention'"),
    ({"num_kv_shared_layers": 1}, r"num_kv_shared_layers 1 \(KV shared across layers\)"),
    ({"attention_sinks": True}, r"attention_sinks True \(attention sinks\)"),
    ({"cache_implementation": "offloaded_hybrid_chunked"}, "cache_implementation 'offloaded_hybrid_chunked'"),
])
def test_what_the_routing_cannot_represent_is_refused_first(extra, needle):
    from types import SimpleNamespace

    from radixlang_runtime.model.models.fallback_probe import refuse_unroutable

    with pytest.raises(ValueError, match=f"ToyForCausalLM cannot run with --model-impl transformers: {needle}"):
        refuse_unroutable(SimpleNamespace(**extra), "ToyForCausalLM")


def test_gemma4_per_layer_attention_shapes_are_refused_by_name():
    """Gemma 4 text sets head_dim per layer type (512 on its global layers): on transformers' modules, not a
    crash inside its per-layer config but a refusal naming the attribute; auto picks the native file."""
    from transformers import Gemma4TextConfig

    text = Gemma4TextConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size_per_layer_input=1000,
                            hidden_size_per_layer_input=16)
    cfg = {**text.to_dict(), "architectures": ["Gemma4ForCausalLM"]}
    with pytest.raises(ValueError, match="Gemma4ForCausalLM cannot run with --model-impl transformers: "
                                         "per_layer_config sets head_dim 16 / 512 per layer"):
        ModelConfig.from_dict(cfg, "transformers")
    assert ModelConfig.from_dict(cfg, "auto").model_impl == "native"  # models/gemma4.py serves it
