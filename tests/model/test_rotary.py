"""RoPE variants (model/layers/rope_spec.py, model/layers/rotary.py) against transformers' own: inverse frequencies and
attention factors from ROPE_INIT_FUNCTIONS, cos/sin tables from LlamaRotaryEmbedding fed one position at a
time (as generate decodes), partial rotary against the q_rot / q_pass formula, refusals by name."""

from __future__ import annotations

import pytest
import torch

from radixlang_runtime.model.layers.rope_spec import parse_rope
from radixlang_runtime.model.layers.rotary import Rotary, inv_freq

HEAD_DIM = 32
BASE = {"hidden_size": 128, "num_attention_heads": 4, "head_dim": HEAD_DIM, "max_position_embeddings": 64,
        "rope_theta": 10000.0}

CASES = {
    "default": {},
    "linear": {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    "linear_legacy_type": {"rope_scaling": {"type": "linear", "factor": 2.5}},
    "dynamic": {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
    "dynamic_big": {"rope_scaling": {"rope_type": "dynamic", "factor": 8.0}, "rope_theta": 500000.0},
    "llama3": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}},
    "llama3_b": {"rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 2.0,
                                  "high_freq_factor": 8.0, "original_max_position_embeddings": 8192},
                 "rope_theta": 500000.0, "max_position_embeddings": 131072},
    "yarn": {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}},
    "yarn_mscale": {"rope_scaling": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707},
                    "max_position_embeddings": 163840},
    "yarn_no_truncate": {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32,
                                          "truncate": False, "attention_factor": 1.25}},
    "yarn_no_factor": {"rope_scaling": {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 16}},
    "longrope": {"rope_scaling": {"type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(16)],
                                  "long_factor": [1.5 + 0.3 * i for i in range(16)]},
                 "original_max_position_embeddings": 16},
    "rope_parameters": {"rope_parameters": {"rope_type": "linear", "factor": 3.0, "rope_theta": 1000.0}},
    "partial": {"partial_rotary_factor": 0.5, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
}


def _hf_config(cfg: dict):
    from transformers import LlamaConfig

    return LlamaConfig(**{k: (dict(v) if isinstance(v, dict) else v) for k, v in cfg.items()})


def _cfg(name: str) -> dict:
    return {**BASE, **CASES[name]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_inv_freq_and_attention_factor_match_transformers(name):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = _cfg(name)
    spec = parse_rope(cfg, HEAD_DIM)
    hf_cfg = _hf_config(cfg)
    if spec.rope_type == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        def fn(c, device, seq_len=None):
            return LlamaRotaryEmbedding.compute_default_rope_parameters(c)
    else:
        fn = ROPE_INIT_FUNCTIONS[spec.rope_type]
    seq_lens = [None]
    if spec.rope_type == "dynamic":
        seq_lens += [torch.tensor(n) for n in (65, 100, 1000)]  # HF passes a forward's max position + 1
    if spec.rope_type == "longrope":
        seq_lens += [17]
    for n in seq_lens:
        want, want_att = fn(hf_cfg, torch.device("cpu"), seq_len=n)
        got, att = inv_freq(spec, None if n is None else int(n))
        assert got.shape == (spec.rotary_dim // 2,)
        assert torch.equal(got, want), (name, n)
        assert att == pytest.approx(want_att, rel=1e-12), (name, n)


@pytest.mark.parametrize("name", sorted(set(CASES) - {"partial"}))
def test_tables_match_transformers_decoding_position_by_position(name):
    """Rotary's row p == what LlamaRotaryEmbedding returns for a forward whose last position is p, fed
    positions in order (generate's decode): static types, and dynamic / longrope past the window."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = _cfg(name)
    spec = parse_rope(cfg, HEAD_DIM)
    P = 160
    rot = Rotary(spec, P, torch.device("cpu"), torch.float32)
    hf = LlamaRotaryEmbedding(_hf_config(cfg))
    x = torch.zeros(1, dtype=torch.float32)
    # a prompt in one forward (inside the original window: HF rotates a longer one with its length), then
    # one position at a time
    start = min(40, spec.original_max_position_embeddings or 40)
    cos, sin = hf(x, torch.arange(start)[None])
    assert torch.equal(rot.cos[:start], cos[0]) and torch.equal(rot.sin[:start], sin[0, :, : HEAD_DIM // 2])
    for p in range(start, P):
        cos, sin = hf(x, torch.tensor([[p]]))
        assert torch.equal(rot.cos[p], cos[0, 0]), (name, p)
        assert torch.equal(rot.sin[p], sin[0, 0, : HEAD_DIM // 2]), (name, p)


def test_scaled_tables_differ_from_default():
    """The variants change the tables (a test above passing on a no-op would prove nothing)."""
    default = Rotary(parse_rope(_cfg("default"), HEAD_DIM), 160, torch.device("cpu"), torch.float32)
    for name in ("linear", "dynamic", "llama3", "yarn", "longrope"):
        rot = Rotary(parse_rope(_cfg(name), HEAD_DIM), 160, torch.device("cpu"), torch.float32)
        assert not torch.equal(rot.cos[100:], default.cos[100:]), name


def test_partial_rotary_matches_rot_pass_split():
    """rotary_dim 16 of 32: the leading 16 lanes rotate (halves of 16), the rest pass through unchanged."""
    spec = parse_rope(_cfg("partial"), HEAD_DIM)
    assert spec.rotary_dim == 16 and spec.partial
    rot = Rotary(spec, 64, torch.device("cpu"), torch.float32)
    assert not rot.full and rot.cos.shape == (64, 16) and rot.sin.shape == (64, 8)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, HEAD_DIM, generator=g)
    pos = torch.tensor([0, 3, 17, 40, 63])
    got = Rotary.apply(x, rot.cos_sin(pos))
    cos = rot.cos[pos].unsqueeze(1)
    sin = torch.cat([rot.sin[pos], rot.sin[pos]], -1).unsqueeze(1)
    x_rot, x_pass = x[..., :16], x[..., 16:]
    rotated = torch.cat([-x_rot[..., 8:], x_rot[..., :8]], -1)
    want = torch.cat([x_rot * cos + rotated * sin, x_pass], -1)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(got[..., 16:], x[..., 16:])
    assert not torch.equal(got[..., :16], x[..., :16])


@pytest.mark.parametrize("cfg,needle", [
    ({"rope_scaling": {"rope_type": "su", "factor": 2.0}}, "rope_type 'su'"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}}, "'low_freq_factor'"),
    ({"rope_scaling": {"rope_type": "dynamic"}}, "'factor'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}}, "'high_freq_factor'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "finetuned": True}}, "'finetuned'"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 16}},
     "'short_factor'"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "2"}}, "'factor'"),
    ({"partial_rotary_factor": 0.3}, "partial_rotary_factor"),
])
def test_refused_by_name(cfg, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        parse_rope({**BASE, **cfg}, HEAD_DIM)
