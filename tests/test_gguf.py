"""GGUF loading: our dequantised, un-permuted weights equal transformers' own GGUF loader's."""

from __future__ import annotations

import numpy as np
import pytest

from radixlang_runtime.model.gguf_convert import hf_tensor_name, unpermute_rotary_rows


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

    from radixlang_runtime.model.resolve import embedded_gguf_path

    gguf = embedded_gguf_path()
    ref = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                               dtype=torch.float32).state_dict()
    ours = load_file(os.path.join(engine_fp32.model_dir, "model.safetensors"))
    for name, t in ours.items():
        torch.testing.assert_close(t, ref[name], rtol=0, atol=0, msg=name)
    assert set(ours) <= set(ref)


def test_missing_model_path_is_a_clear_error(tmp_path):
    from radixlang_runtime.model.resolve import resolve_model_dir

    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_dir(str(tmp_path / "nope.gguf"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_dir(str(tmp_path))
