"""SmolLM3 (SmolLM3ForCausalLM: the Llama decoder with NoPE layers) end to end: tiny random checkpoints written by
transformers with the NoPE layers away from the default every-fourth position, served in float32 greedy token for
token against transformers (a batch, chunked prefill, a pool tight enough to retract, a radix-cache hit; with
use_sliding_window, the NoPE layer slides), on the Triton backend too; the fused decode layer bit-identical to the
modules on NoPE layers; a smollm3 GGUF laid out as llama.cpp's converter writes it, served on dense and block
linears; a bare SmolLM3Model pooled under --is-embedding; what is not honoured refused by name. Run under
RADIXLANG_CPU_MASK=cc too: the torch rotary path instead of rope_store.c."""

from __future__ import annotations

import numpy as np
import pytest

from radixlang_runtime.model.loader.config import ModelConfig
from test_model_families import assert_windowed_parity
from tiny_checkpoints import build_tiny, hf_greedy, with_config

SMOL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True, initializer_range=0.3)
PLAIN = {"rope_type": "default", "rope_theta": 10000.0}
NOPE_1 = [1, 0, 1, 1]  # layer 1 has no rotary (the default interval's NoPE layer is layer 3)
NOPE_2 = [1, 1, 0, 1]
CASES = {
    # SmolLM3Config's default rope theta; the contrasts: no NoPE layer, and the default interval's NoPE layer
    "nope": ({"no_rope_layers": NOPE_1}, [{"no_rope_layers": [1] * 4}, {"no_rope_layers": [1, 1, 1, 0]}]),
    # use_sliding_window: the NoPE layer (layer 2) sees the last 8 positions
    "nope_window": ({"no_rope_layers": NOPE_2, "use_sliding_window": True, "sliding_window": 8,
                     "rope_parameters": PLAIN},
                    [{"layer_types": ["full_attention"] * 4}, {"no_rope_layers": [1] * 4}]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_smollm3_matches_transformers(name, tmp_path):
    kwargs, contrasts = CASES[name]
    assert_windowed_parity(tmp_path, "SmolLM3Config", kwargs, contrasts, tiny=SMOL)
    parsed = ModelConfig.from_dir(str(tmp_path))
    assert parsed.architecture == "SmolLM3ForCausalLM" and parsed.model_impl == "native"
    assert parsed.layer_rope == tuple(bool(r) for r in kwargs["no_rope_layers"])
    window = kwargs.get("sliding_window", 0)
    assert parsed.layer_windows == (tuple(window * (1 - r) for r in kwargs["no_rope_layers"]) if window else ())


def test_smollm3_on_the_triton_backend_matches_transformers(tmp_path):
    """The Triton kernels (interpreted on CPU) attend over what the model rotated, or did not: NoPE on layer 1, the
    sliding NoPE layer 2 past its window, chunked prefill and a radix-cache hit."""
    pytest.importorskip("triton")
    from radixlang_runtime import Engine
    from test_model_families import LONG_PROMPTS

    model = build_tiny(tmp_path, "SmolLM3Config", SMOL, {
        "max_position_embeddings": 256, "no_rope_layers": [1, 0, 0, 1], "use_sliding_window": True,
        "sliding_window": 8, "layer_types": ["full_attention", "full_attention", "sliding_attention", "full_attention"],
        "rope_parameters": PLAIN})
    prompts, new = LONG_PROMPTS[1:4:2], 10
    want = [hf_greedy(model, p, new) for p in prompts]
    sp = {"max_new_tokens": new, "min_new_tokens": new, "temperature": 0}
    with Engine(str(tmp_path), dtype="float32", attention_backend="triton", max_total_tokens=512,
                chunked_prefill_size=16, page_size=1, debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=prompts, sampling_params=sp)
        again = eng.generate(input_ids=prompts[1] + [5, 6, 7], sampling_params=sp)
    assert [o["output_ids"] for o in outs] == want
    assert again["meta_info"]["cached_tokens"] >= len(prompts[1])
    assert again["output_ids"] == hf_greedy(model, prompts[1] + [5, 6, 7], new)


@pytest.mark.parametrize("kw", [dict(dtype="float32"), dict(dtype="bfloat16", quantization="int8")],
                         ids=["fp32", "int8"])
def test_fused_decode_on_nope_layers_is_bit_identical_to_the_modules(kw, tmp_path):
    """decode_layer.c skips the rotary on the NoPE layer as the modules' rope_store call does: the same logits and
    the same K/V (the layer 0 and last-layer planes) through the fused decode and through the modules."""
    import torch

    from radixlang_kernels.cpu_caps import detect
    from radixlang_runtime import Engine
    from runner_steps import decode_scenario

    if detect().compiler is None:
        pytest.skip("no C compiler: no fused decode")
    build_tiny(tmp_path, "SmolLM3Config", SMOL, {"no_rope_layers": [0, 1, 1, 0], "rope_parameters": PLAIN})
    prompts = [[(i * 37 + 11) % 40000 + 100 for i in range(n)] for n in (5, 23, 9)]
    with Engine(str(tmp_path), max_total_tokens=2048, **kw) as eng:
        runner = eng.runner
        model, fused = runner.model, runner.model.fused_decode
        assert fused is not None, runner.cpu_paths
        assert [w.nope for w in fused.weights] == [1, 0, 0, 1]
        calls = []
        run = fused.run
        fused.run = lambda residual, fb: (calls.append(fb.batch_size), run(residual, fb))[1]
        with torch.inference_mode():
            got, got_kv = decode_scenario(runner, prompts, 0, 0)
            assert calls == [3] * 4
            model.fused_decode = None
            want, want_kv = decode_scenario(runner, prompts, 3, 1000)
            model.fused_decode = fused
    for step, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"step {step}: max diff {(a - b).abs().max().item()}"
    assert torch.equal(got_kv, want_kv)


PROMPTS = [list(range(300, 320)), [5, 77, 1200, 9, 4000, 31]]
NEW = 10


def test_bare_smollm3_model_pools_its_final_hidden_states(tmp_path):
    """A bare SmolLM3Model checkpoint (no LM head, tensors without the `model.` prefix, as sentence-transformers
    saves it) serves --is-embedding on the same decoder: each prompt's last-token final hidden state, L2-normalized,
    as transformers' SmolLM3Model computes it with the NoPE layer off the default interval."""
    import torch
    from transformers import AutoTokenizer

    from radixlang_runtime import Engine

    model = build_tiny(tmp_path / "lm", "SmolLM3Config", SMOL, {"no_rope_layers": NOPE_1, "rope_parameters": PLAIN})
    model.model.save_pretrained(tmp_path / "bare", safe_serialization=True)
    AutoTokenizer.from_pretrained(tmp_path / "lm").save_pretrained(tmp_path / "bare")
    parsed = ModelConfig.from_dir(str(tmp_path / "bare"))
    assert parsed.model_impl == "native" and parsed.layer_rope == tuple(bool(r) for r in NOPE_1)
    with torch.no_grad():
        want = [torch.nn.functional.normalize(model.model(torch.tensor([p])).last_hidden_state[0, -1], dim=0)
                for p in PROMPTS]
    with Engine(str(tmp_path / "bare"), is_embedding=True, dtype="float32", max_total_tokens=1024) as eng:
        got = [torch.tensor(eng.encode(input_ids=p)["embedding"]) for p in PROMPTS]
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-4), (g - w).abs().max().item()
LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def test_smollm3_gguf_as_llamacpp_writes_it(tmp_path):
    """llama.cpp's smollm3 file: llama's names and permuted q / k rows, no key for the NoPE layers (its graph skips
    the rotary on every fourth layer). Converted back to the same tensors, served dense and on Q8_0 blocks
    (--quantization gguf, float32 sums of the same values): transformers' tokens on the converted weights."""
    import torch

    from gguf_tiny import convert_tiny, write_gguf
    from radixlang_runtime import Engine
    from radixlang_runtime.model.layers.gguf_linear import GGUFLinear

    hf_dir = tmp_path / "hf"
    model = build_tiny(hf_dir, "SmolLM3Config", SMOL, {"max_position_embeddings": 256, "rope_parameters": PLAIN})
    assert model.config.no_rope_layers == [1, 1, 1, 0]  # transformers' default interval: llama.cpp's step
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied: no output.weight
    kinds = {f"blk.{i}.{n}.weight": ("Q8_0", None) for i in range(4) for n in LINEARS}
    path = str(tmp_path / "m.gguf")
    write_gguf(path, "smollm3", model.config, state, kinds=kinds)
    got = convert_tiny(path, str(tmp_path / "conv"), str(hf_dir))
    assert set(got) == set(state)
    parsed = ModelConfig.from_dir(str(tmp_path / "conv"))
    assert parsed.architecture == "SmolLM3ForCausalLM"
    assert parsed.layer_rope == tuple(bool(r) for r in model.config.no_rope_layers)
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in got.items()}, strict=False)
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    every_rope = with_config(model, {"no_rope_layers": [1] * 4})
    assert [hf_greedy(every_rope, p, NEW) for p in PROMPTS] != want  # the NoPE layer changes the tokens
    sp = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
    for quantization, blocks in ((None, 0), ("gguf", 4 * 4)):  # q / k / v fused: four block linears a layer
        with Engine(str(tmp_path / "conv"), dtype="float32", max_total_tokens=1024, quantization=quantization) as eng:
            assert sum(isinstance(m, GGUFLinear) for m in eng.runner.model.modules()) == blocks
            assert [o["output_ids"] for o in eng.generate(input_ids=PROMPTS, sampling_params=sp)] == want


def test_smollm3_gguf_keys_llamacpp_does_not_read_are_refused(tmp_path):
    import gguf

    from radixlang_runtime.model.loader.gguf_convert import gguf_to_hf_config

    path = str(tmp_path / "k.gguf")
    w = gguf.GGUFWriter(path, "smollm3")
    for key, value in {"block_count": 4, "context_length": 64, "embedding_length": 64, "feed_forward_length": 128,
                       "head_count": 4, "head_count_kv": 2, "layer_norm_rms_eps": 1e-6, "vocab_size": 100,
                       "sliding_window": 8}.items():
        getattr(w, f"add_{key}")(value)
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="GGUF key 'smollm3.attention.sliding_window' is not supported"):
        gguf_to_hf_config(gguf.GGUFReader(path))


BASE = {"architectures": ["SmolLM3ForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}


@pytest.mark.parametrize("extra,needle", [
    ({"attention_bias": True}, "attention_bias true is not supported"),
    ({"mlp_bias": True}, "mlp_bias true is not supported"),
    ({"no_rope_layers": [1, 0]}, "no_rope_layers has 2 entries for 4 layers"),
    ({"no_rope_layer_interval": 0}, "no_rope_layer_interval 0 must be a positive"),
    ({"layer_types": ["sliding_attention"] * 4, "sliding_window": 8},
     "layer_types sliding_attention with use_sliding_window False"),
    ({"use_sliding_window": True, "sliding_window": 0}, "sliding_window 0 must be a positive"),
    ({"layer_types": ["chunked_attention"] * 4}, "layer_types entry 'chunked_attention'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
])
def test_unhonoured_smollm3_fields_are_refused(extra, needle):
    with pytest.raises(ValueError, match=needle):
        ModelConfig.from_dict({**BASE, **extra})


def test_smollm3_defaults_follow_transformers():
    """SmolLM3Config's defaults: a NoPE layer every fourth, rope theta 2e6, tied embeddings; no_rope_layers longer
    than the model is read up to its layers, as transformers indexes it."""
    from transformers import SmolLM3Config

    ref = SmolLM3Config(**{k: v for k, v in BASE.items() if k != "architectures"} | {"num_hidden_layers": 8})
    cfg = ModelConfig.from_dict({**BASE, "num_hidden_layers": 8})
    assert cfg.layer_rope == tuple(bool(r) for r in ref.no_rope_layers)
    assert cfg.rope.theta == ref.rope_parameters["rope_theta"]
    assert cfg.tie_word_embeddings == ref.tie_word_embeddings
    longer = ModelConfig.from_dict({**BASE, "no_rope_layers": NOPE_2 + [0, 0]})
    assert longer.layer_rope == tuple(bool(r) for r in NOPE_2)
