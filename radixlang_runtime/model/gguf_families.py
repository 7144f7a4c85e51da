"""What each GGUF architecture adds to the shared llama mapping (gguf_convert.py): its HF architecture, its
config.json fields, its tensor names, and RoPE scaling stored as tensors. No torch.

- qwen2moe / qwen3moe: the router (ffn_gate_inp), experts stacked per layer (ffn_{gate,up,down}_exps:
  [E, I, hidden] / [E, hidden, I]) written as transformers 5's stacked mlp.experts.gate_up_proj [E, 2I, hidden]
  (gate rows first) and mlp.experts.down_proj; Qwen2-MoE's shared expert (ffn_*_shexp) and its gate
  (ffn_gate_inp_shexp [hidden] -> [1, hidden]); layers without a router are dense (mlp_only_layers).
- phi3: q/k/v fused (attn_qkv) and gate/up fused (ffn_up [2I, hidden]), as Phi-3's own checkpoints store them;
  longrope from rope_factors_{short,long}.
- llama: rope_freqs (llama.cpp's per-dimension divisors of Llama 3.x's llama3 scaling) -> rope_type llama3,
  the parameters found by reproducing the tensor (any parameters that reproduce it give the same RoPE).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np

ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
         "qwen2moe": "Qwen2MoeForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM", "phi3": "Phi3ForCausalLM"}
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")  # config, not weights

_MOE_LAYER_NAMES = {
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    "ffn_gate_exps.weight": "mlp.experts.gate_proj",  # stacked; joined with up_exps by join_experts
    "ffn_up_exps.weight": "mlp.experts.up_proj",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
}
_PHI3_LAYER_NAMES = {"attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"}


def layer_names(arch: str) -> dict[str, str]:
    """The arch's block tensor names beyond the llama ones (GGUF suffix -> HF suffix; they win)."""
    if arch in ("qwen2moe", "qwen3moe"):
        return _MOE_LAYER_NAMES
    return _PHI3_LAYER_NAMES if arch == "phi3" else {}


def family_config(arch: str, a: Callable, names: set[str], layers: int) -> dict:
    """config.json fields of the arch beyond the shared ones; `a(key, default)` reads `{arch}.{key}`."""
    if arch in ("qwen2moe", "qwen3moe"):
        out = {"num_experts": int(a("expert_count")), "num_experts_per_tok": int(a("expert_used_count")),
               "moe_intermediate_size": int(a("expert_feed_forward_length")),
               # llama.cpp normalises the top-k weights for qwen3moe, not for qwen2moe (unless the file says)
               "norm_topk_prob": bool(a("expert_weights_norm", arch == "qwen3moe")), "decoder_sparse_step": 1,
               "mlp_only_layers": [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in names]}
        if arch == "qwen2moe":
            shared = int(a("expert_shared_feed_forward_length", 0))
            out.update(shared_expert_intermediate_size=shared, qkv_bias="blk.0.attn_q.bias" in names)
        return out
    if arch == "phi3":
        window = a("attention.sliding_window")
        return {"sliding_window": None if window is None else int(window)}
    return {}


def join_experts(out: dict[str, np.ndarray]) -> None:
    """Stacked gate [E, I, hidden] + up -> mlp.experts.gate_up_proj [E, 2I, hidden] (gate first), in place;
    a shared-expert gate stored as [hidden] becomes [1, hidden]."""
    for name in [n for n in out if n.endswith("mlp.experts.gate_proj")]:
        up = name[: -len("gate_proj")] + "up_proj"
        out[name[: -len("gate_proj")] + "gate_up_proj"] = np.concatenate([out.pop(name), out.pop(up)], axis=1)
    for name in [n for n in out if n.endswith("mlp.shared_expert_gate.weight")]:
        out[name] = out[name].reshape(1, -1)


def tensor_rope(reader, arch: str, a: Callable, head_dim: int) -> Optional[dict]:
    """rope_scaling from RoPE tensors (None: the file has none); ValueError when they cannot be mapped."""
    tensors = {t.name: t for t in reader.tensors if t.name in ROPE_TENSORS}
    if not tensors:
        return None
    data = {n: np.asarray(t.data, dtype=np.float64).reshape(-1) for n, t in tensors.items()}
    dims = int(a("rope.dimension_count", head_dim))
    if arch == "llama" and set(data) == {"rope_freqs.weight"}:
        return _llama3_from_freqs(data["rope_freqs.weight"], float(a("rope.freq_base", 10000.0)), dims)
    if arch == "phi3" and set(data) == {"rope_factors_long.weight", "rope_factors_short.weight"}:
        scaling = {"rope_type": "longrope", "short_factor": data["rope_factors_short.weight"].tolist(),
                   "long_factor": data["rope_factors_long.weight"].tolist(),
                   "original_max_position_embeddings": int(a("rope.scaling.original_context_length",
                                                             a("context_length", 4096)))}
        attn = a("rope.scaling.attn_factor")
        if attn is not None:
            scaling["attention_factor"] = float(attn)
        return scaling
    raise ValueError(f"GGUF tensor(s) {sorted(data)} (RoPE frequency factors) are not supported for {arch}")


def llama3_factors(theta: float, dims: int, factor: float, low: float, high: float, old: int) -> np.ndarray:
    """llama.cpp's rope_freqs for Llama 3.x's llama3 scaling: the divisor of each rotary frequency [dims / 2]."""
    freqs = 1.0 / (theta ** (np.arange(0, dims, 2, dtype=np.float64) / dims))
    wavelen = 2 * math.pi / freqs
    smooth = (old / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old / high, 1.0, np.where(wavelen > old / low, factor, mid))


# the factors depend on low / old and high / old only, so powers of two cover every original context in steps
# of 2x; Llama 3.1 / 3.2 / 3.3: 8192, 1, 4
_OLD_CONTEXTS = (8192, *(2 ** k for k in range(5, 18) if k != 13))
_LOW, _HIGH = (1.0, 0.5, 2.0, 4.0), (4.0, 2.0, 8.0, 16.0, 32.0, 1.0)


def _llama3_from_freqs(f: np.ndarray, theta: float, dims: int) -> dict:
    factor = float(f.max())
    if f.shape[0] != dims // 2 or factor < 1.0:
        raise ValueError(f"GGUF tensor 'rope_freqs.weight' (shape {f.shape}) does not look like llama3 scaling")
    for old in _OLD_CONTEXTS:
        for low in _LOW:
            for high in (h for h in _HIGH if h > low):
                if np.allclose(llama3_factors(theta, dims, factor, low, high, old), f, rtol=1e-4, atol=1e-6):
                    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                            "high_freq_factor": high, "original_max_position_embeddings": old}
    raise ValueError("GGUF tensor 'rope_freqs.weight' matches no llama3 scaling (factor, low / high frequency "
                     "factors, original context) tried: its per-dimension factors are not supported")
