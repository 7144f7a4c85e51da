"""GGUF loading: our dequantised, un-permuted weights equal transformers' own GGUF loader's."""

from __future__ import annotations

import numpy as np
import pytest

from radixlang_runtime.model.loader.gguf_convert import hf_tensor_name, unpermute_rotary_rows


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The forward permutation llama.cpp's converter applies to q/k rows."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("heads,head_dim", [(9, 64), (3, 64), (4, 8)])
def test_unpermute_inverts_llama_cpp_permute(heads, head_dim):
    w = np.random.default_rng(0).standard_normal((heads * head_dim, 5)).astype(np.float32)
    np.testing.assert_array_equal(unpermute_rotary_rows(llama_cpp_permute(w, heads), heads), w)


def test_tensor_names():
    assert hf_tensor_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    with pytest.raises(ValueError):
        hf_tensor_name("blk.0.mystery.weight")


def test_embedded_model_equals_transformers_gguf_loader(engine_fp32):
    import os

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from radixlang_runtime.model.loader.resolve import embedded_gguf_path

    gguf = embedded_gguf_path()
    ref = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                               dtype=torch.float32).state_dict()
    ours = load_file(os.path.join(engine_fp32.model_dir, "model.safetensors"))
    for name, t in ours.items():
        torch.testing.assert_close(t, ref[name], rtol=0, atol=0, msg=name)
    assert set(ours) <= set(ref)


def test_missing_model_path_is_a_clear_error(tmp_path):
    from radixlang_runtime.model.loader.resolve import resolve_model_dir

    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_dir(str(tmp_path / "nope.gguf"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_dir(str(tmp_path))


class _Field:
    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


class _Tensor:
    def __init__(self, name, data=None):
        self.name = name
        self.data = data


class _Reader:
    """The parts of gguf.GGUFReader that gguf_to_hf_config reads."""

    def __init__(self, fields: dict, tensors=("token_embd.weight",)):
        base = {"general.architecture": "llama", "llama.attention.head_count": 4, "llama.embedding_length": 64,
                "llama.vocab_size": 100, "llama.feed_forward_length": 128, "llama.block_count": 2,
                "llama.context_length": 256}
        self.fields = {k: _Field(v) for k, v in {**base, **fields}.items()}
        self.tensors = [_Tensor(*n) if isinstance(n, tuple) else _Tensor(n) for n in tensors]


@pytest.mark.parametrize("fields,want", [
    ({}, None),
    ({"llama.rope.scaling.type": "none"}, None),
    ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}, {"rope_type": "linear", "factor": 4.0}),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
      "llama.rope.scaling.original_context_length": 64, "llama.rope.scaling.finetuned": True},
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
])
def test_gguf_rope_scaling_is_carried_into_the_config(fields, want):
    from radixlang_runtime.model.loader.config import ModelConfig
    from radixlang_runtime.model.loader.gguf_convert import gguf_to_hf_config

    cfg = gguf_to_hf_config(_Reader(fields))
    assert cfg.get("rope_scaling") == want
    assert ModelConfig.from_dict(cfg).rope.rope_type == (want or {}).get("rope_type", "default")


@pytest.mark.parametrize("fields,tensors,needle", [
    ({"llama.rope.scaling.type": "longrope"}, (), "rope.scaling.type 'longrope'"),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.attn_factor": 0.5}, (), "llama.rope.scaling.attn_factor"),
    ({}, (("rope_freqs.weight", np.full(8, 3.0)),), "'rope_freqs.weight' matches no llama3 scaling"),
    ({}, (("rope_factors_long.weight", np.ones(8)),), r"\['rope_factors_long.weight'\] .* not supported for llama"),
])
def test_gguf_rope_fields_without_a_mapping_are_refused(fields, tensors, needle):
    from radixlang_runtime.model.loader.gguf_convert import gguf_to_hf_config

    with pytest.raises(ValueError, match=needle):
        gguf_to_hf_config(_Reader(fields, ("token_embd.weight", *tensors)))


def test_gguf_partial_rotary_is_refused_by_the_config():
    from radixlang_runtime.model.loader.config import ModelConfig
    from radixlang_runtime.model.loader.gguf_convert import gguf_to_hf_config

    cfg = gguf_to_hf_config(_Reader({"llama.rope.dimension_count": 8}))  # head_dim 16
    assert cfg["partial_rotary_factor"] == 0.5
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        ModelConfig.from_dict(cfg)
