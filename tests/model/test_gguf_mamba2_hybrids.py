"""GGUF files of the Mamba2 hybrids (llama.cpp's granitehybrid, nemotron_h, nemotron_h_moe) end to end: a tiny
transformers checkpoint written as llama.cpp's converter writes it (tests/gguf_llamacpp.py, gguf_llamacpp_mamba2.py),
converted by gguf_convert: the same tensors back under transformers' names, and, served by the Engine in float32 with
prefill chunks shorter than the prompt, transformers' greedy tokens on the weights the file holds, token for token
(F32, and Q8_0 where the rows allow it); a continuation of a finished request starts from its state snapshot.
Metadata the converter does not honour is refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import ExpertGatingFuncType

from gguf_llamacpp import write_llamacpp_gguf
from gguf_tiny import convert_tiny
from tiny_checkpoints import GRANITE_CASES, GRANITE_TINY, NEMOTRON_TINY, build_tiny, hf_greedy

NEW = 6
LONG = list(range(300, 400))  # 100 tokens: four prefill chunks of 32
PROMPTS = [LONG, [5, 77, 1200, 9, 4000, 31]]
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
FINISHED = (len(LONG) + NEW - 1) // 4 * 4  # page 4: where a finished request on LONG leaves its state
ENGINE = dict(dtype="float32", max_total_tokens=1024, page_size=4, chunked_prefill_size=32, model_impl="native",
              debug_check_integrity=True)
Q8 = ("ssm_in.weight", "ssm_out.weight", "attn_q.weight", "attn_output.weight", "ffn_gate_exps.weight",
      "ffn_down_exps.weight", "ffn_up_shexp.weight")

NEMOTRON_DENSE = {"layers_block_type": ["linear_attention", "full_attention", "mlp", "linear_attention", "mlp"],
                  "mlp_bias": True}
# name -> (gguf arch, tiny checkpoint case, its tiny config, GGUF keys beyond the converter's, tensors in Q8_0)
CASES = {
    # MoE beside the shared expert, attention without positions (what the converter writes for a hybrid)
    "granite_moe": ("granitehybrid", GRANITE_CASES["granite_moe_nope"], GRANITE_TINY, {}, ()),
    "granite_moe_q8_0": ("granitehybrid", GRANITE_CASES["granite_moe_nope"], GRANITE_TINY, {}, Q8),
    # the dense shared MLP alone, biases on attention and Mamba2, tied embeddings; rope: a file whose
    # rope.scaling.finetuned says so (the converter writes false for every hybrid)
    "granite_dense_rope": ("granitehybrid", GRANITE_CASES["granite_dense_rope"], GRANITE_TINY,
                           {"rope_scaling_finetuned": True}, ()),
    # Mamba2, attention and relu^2 MLP blocks (with biases), two groups of B / C
    "nemotron_h": ("nemotron_h", ("NemotronHConfig", NEMOTRON_DENSE), NEMOTRON_TINY, {}, ()),
    "nemotron_h_q8_0": ("nemotron_h", ("NemotronHConfig", NEMOTRON_DENSE), NEMOTRON_TINY, {},
                        ("ssm_in.weight", "ssm_out.weight", "attn_q.weight", "attn_output.weight", "ffn_up.weight")),
    # Nemotron 3's layout: Mamba2, attention and MoE blocks, the experts through latent projections
    "nemotron_h_moe": ("nemotron_h_moe", ("NemotronHConfig", {
        "layers_block_type": ["linear_attention", "moe", "full_attention", "moe"], "moe_latent_size": 40}),
        NEMOTRON_TINY, {}, ()),
}


def _write(name: str, tmp_path, extra: dict | None = None):
    arch, (cls_name, kwargs), tiny, keys, quantized = CASES[name]
    hf_dir = tmp_path / "hf"
    model = build_tiny(hf_dir, cls_name, tiny, kwargs)
    _randomise_zeros(model)
    kinds = {f"blk.{i}.{s}": "Q8_0" for i in range(model.config.num_hidden_layers) for s in quantized}
    written = write_llamacpp_gguf(str(tmp_path / "m.gguf"), arch, model.config, model.state_dict(), kinds=kinds,
                                  extra={**keys, **(extra or {})})
    return model, hf_dir, written, quantized


def _randomise_zeros(model) -> None:
    """transformers initialises some tensors to zeros (Nemotron-H's correction bias): random values make their
    layout count."""
    import torch

    torch.manual_seed(1)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if not p.any():
                p.normal_(0.0, 0.1)
        for m in model.modules():
            if getattr(m, "e_score_correction_bias", None) is not None and not m.e_score_correction_bias.any():
                m.e_score_correction_bias.normal_(0.0, 0.5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gguf_mamba2_hybrid_round_trip_and_parity(name, tmp_path):
    import torch

    from radixlang_runtime import Engine

    model, hf_dir, written, quantized = _write(name, tmp_path)
    assert {n.split(".", 2)[-1] for n in written if n.startswith("blk.")} >= set(quantized)
    got = convert_tiny(str(tmp_path / "m.gguf"), str(tmp_path / "conv"), str(hf_dir))
    state = {k: v for k, v in model.state_dict().items()
             if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}
    assert set(got) == set(state)
    with open(tmp_path / "conv" / "config.json") as f:
        config = json.load(f)
    assert config["architectures"] == model.config.architectures
    if config["model_type"] == "nemotron_h":
        assert config["layers_block_type"] == model.config.layers_block_type
    else:
        assert config["layer_types"] == [t.replace("linear_attention", "mamba").replace("full_attention", "attention")
                                         for t in model.config.layer_types]
    for k, v in state.items():
        if not quantized and k.endswith("A_log"):  # -exp and back
            np.testing.assert_allclose(got[k], v.numpy(), rtol=1e-6, atol=1e-6, err_msg=k)
        elif not quantized:  # F32: the round trip is exact
            np.testing.assert_array_equal(got[k], v.numpy(), err_msg=k)
        else:  # within Q8_0's step
            np.testing.assert_allclose(got[k], v.numpy(), atol=float(v.abs().max()) / 100 + 1e-6, err_msg=k)
    changed = sum(not np.array_equal(got[k], v.numpy()) for k, v in state.items())
    assert changed >= (len(quantized) // 2 if quantized else 0)  # the Q8_0 tensors hold quantized values
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in got.items()}, strict=False)  # the file's
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    assert sum(len(set(w)) > 1 for w in want) >= 1  # not a degenerate model
    with Engine(str(tmp_path / "conv"), **ENGINE) as eng:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=SP)
        assert [o["output_ids"] for o in outs] == want
        extended = LONG + want[0] + [11, 12, 13, 14, 15]
        again = eng.generate(input_ids=extended, sampling_params=SP)
        eng.check_integrity()
        pool = eng.get_stats()["state_pool"]
    assert again["output_ids"] == hf_greedy(model, extended, NEW)
    assert again["meta_info"]["cached_tokens"] == FINISHED  # the finished request's state snapshot
    assert pool["snapshot_hits"] >= 1 and pool["request_slots_in_use"] == 0


def test_the_converters_hybrid_file_serves_attention_without_positions(tmp_path):
    """The converter writes rope.scaling.finetuned false for a hybrid (llama.cpp then rotates nothing) and a
    context of 2 ** 20; the layer pattern and Granite's scalars come back."""
    import gguf

    from radixlang_runtime.model.loader.gguf_convert import gguf_to_hf_config

    model, _, _, _ = _write("granite_dense_rope", tmp_path, {"rope_scaling_finetuned": False})
    cfg = gguf_to_hf_config(gguf.GGUFReader(str(tmp_path / "m.gguf")))
    c = model.config
    assert (cfg["position_embedding_type"], cfg["max_position_embeddings"]) == ("nope", 2 ** 20)
    assert cfg["layer_types"] == ["attention", "mamba", "mamba", "attention"]
    assert cfg["num_key_value_heads"] == c.num_key_value_heads and cfg["num_local_experts"] == 0
    assert (cfg["embedding_multiplier"], cfg["residual_multiplier"], cfg["logits_scaling"]) == (
        c.embedding_multiplier, c.residual_multiplier, c.logits_scaling)
    assert cfg["attention_multiplier"] == pytest.approx(c.attention_multiplier)
    assert (cfg["mamba_n_heads"], cfg["mamba_d_head"], cfg["mamba_d_state"], cfg["mamba_n_groups"]) == (
        c.mamba_n_heads, c.mamba_d_head, c.mamba_d_state, c.mamba_n_groups)
    assert (cfg["mamba_conv_bias"], cfg["mamba_proj_bias"], cfg["attention_bias"]) == (False, True, True)


# name -> (case, GGUF keys beyond the converter's (GGUFWriter add_*), the error)
REFUSED = {
    "dt_b_c_rms": ("granite_moe", {"ssm_dt_b_c_rms": True}, "GGUF key 'granitehybrid.ssm.dt_b_c_rms' is not supported"),
    "kv_per_layer": ("granite_moe", {"head_count_kv": [0, 2, 0, 1]},
                     r"granitehybrid.attention.head_count_kv per layer \[1, 2\] is not supported"),
    "kv_entries": ("granite_moe", {"head_count_kv": [0, 2, 0]}, "head_count_kv has 3 entries for 4 layers"),
    "gating": ("granite_moe", {"expert_gating_func": ExpertGatingFuncType.SIGMOID},
               "GGUF key 'granitehybrid.expert_gating_func' is not supported"),
    "nemotron_softmax": ("nemotron_h_moe", {"expert_gating_func": ExpertGatingFuncType.SOFTMAX},
                         "nemotron_h_moe.expert_gating_func 1 is not supported"),
    "nemotron_dense_experts": ("nemotron_h", {"expert_count": 4},
                               "GGUF key 'nemotron_h.expert_count' is not supported"),
    # what llama.cpp's converter writes when transformers' config defaults make a dense checkpoint look MoE: the
    # MLP blocks count as Mamba2
    "nemotron_pattern": ("nemotron_h", {"feed_forward_length": [0, 0, 0, 0, 0]},
                         "GGUF nemotron_h: blk.2 has no ssm_in.weight but its per-layer counts make it a "
                         "linear_attention block"),
    "nemotron_widths": ("nemotron_h", {"feed_forward_length": [0, 0, 48, 0, 32]},
                        r"nemotron_h.feed_forward_length per layer \[32, 48\] is not supported"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_metadata_not_honoured_is_refused_by_name(name, tmp_path):
    import gguf

    from radixlang_runtime.model.loader.gguf_convert import gguf_to_hf_config

    case, keys, message = REFUSED[name]
    _write(case, tmp_path, keys)
    with pytest.raises(ValueError, match=message):
        gguf_to_hf_config(gguf.GGUFReader(str(tmp_path / "m.gguf")))
