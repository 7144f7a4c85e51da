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
- smollm3: llama's tensors (q / k rows permuted the same way); its NoPE layers have no key: llama.cpp's graph
  skips the rotary on every fourth layer (n_no_rope_layer_step 4), written as no_rope_layers. No sliding window
  (llama.cpp reads none for smollm3: the key is refused).
- gemma2 / gemma3: llama.cpp stores every RMSNorm weight as 1 + w (NORM_PLUS_ONE: we subtract 1, and the Gemma
  model adds it back: the file's 1 + w again, exactly in float32 wherever 1 + w >= 0.5); pre + post
  norms (post_attention_norm, ffn_norm = pre-feed-forward, post_ffw_norm); the layer pattern from
  attention.sliding_window_pattern (a period or a per-layer list) else llama.cpp's (gemma2: 2, gemma3: 6);
  query_pre_attn_scalar as llama.cpp derives it (hidden / heads for the 27B layer counts, else head_dim: the
  file has no key for it); gemma3's local layers rotate with rope.freq_base_swa (default 10,000), unscaled.

Architectures served by their own native model (deepseek2, ...) describe themselves in a GGUFFamily
(gguf_family.py; one module each, collected in FAMILIES).

Every `{arch}.` metadata key is read or refused by name (KEYS, family_keys): a key we do not honour would
change the model's math without us knowing.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np

from radixlang_runtime.model.loader import (gguf_deepseek2, gguf_glm4moe, gguf_gpt_oss, gguf_granitehybrid, gguf_llama4,
                                            gguf_nemotron_h, gguf_qwen3next)
from radixlang_runtime.model.loader.gguf_family import GGUFFamily

FAMILIES: dict[str, GGUFFamily] = {f.arch: f for f in (gguf_deepseek2.FAMILY, gguf_glm4moe.FAMILY, gguf_gpt_oss.FAMILY,
                                                  gguf_granitehybrid.FAMILY, gguf_llama4.FAMILY,
                                                  gguf_nemotron_h.FAMILY, gguf_nemotron_h.MOE_FAMILY,
                                                  gguf_qwen3next.FAMILY)}
ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
         "qwen2moe": "Qwen2MoeForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM", "phi3": "Phi3ForCausalLM",
         "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM", "smollm3": "SmolLM3ForCausalLM"}
HF_MODEL_TYPES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gemma3": "gemma3_text"}  # where they differ
ARCHS.update({f.arch: f.hf_arch for f in FAMILIES.values()})
HF_MODEL_TYPES.update({f.arch: f.model_type for f in FAMILIES.values()})
NORM_PLUS_ONE = ("gemma2", "gemma3")  # llama.cpp wrote 1 + w for every *norm.weight
PERMUTED_QK = ("llama", "smollm3")  # model types whose q / k rows llama.cpp's converter permuted (LlamaModel)
_SMOLLM3_NOPE_STEP = 4  # llama.cpp's smollm3 graph: every fourth layer has no rotary (no GGUF key says otherwise)
# the `{arch}.` keys every architecture reads (gguf_convert.gguf_to_hf_config; rope.scaling.*: gguf_rope_fields)
KEYS = ("block_count", "context_length", "embedding_length", "feed_forward_length", "vocab_size",
        "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
        "attention.key_length", "attention.value_length", "rope.freq_base", "rope.dimension_count")
_MOE_KEYS = ("expert_count", "expert_used_count", "expert_feed_forward_length", "expert_weights_norm",
             "expert_gating_func")
_GEMMA_KEYS = ("attention.sliding_window", "attention.sliding_window_pattern", "attn_logit_softcapping",
               "final_logit_softcapping")
_FAMILY_KEYS = {"qwen2moe": _MOE_KEYS + ("expert_shared_feed_forward_length",), "qwen3moe": _MOE_KEYS,
                "phi3": ("attention.sliding_window",), "gemma2": _GEMMA_KEYS,
                "gemma3": _GEMMA_KEYS + ("rope.freq_base_swa",)}
_GATING_SOFTMAX = 1  # gguf.ExpertGatingFuncType.SOFTMAX: the only router these MoE families have
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
_GEMMA_LAYER_NAMES = {"post_attention_norm.weight": "post_attention_layernorm.weight",
                      "ffn_norm.weight": "pre_feedforward_layernorm.weight",
                      "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}


def layer_names(arch: str) -> dict[str, str]:
    """The arch's block tensor names beyond the llama ones (GGUF suffix -> HF suffix; they win)."""
    if arch in FAMILIES:
        return FAMILIES[arch].layer_names
    if arch in ("qwen2moe", "qwen3moe"):
        return _MOE_LAYER_NAMES
    if arch in NORM_PLUS_ONE:
        return _GEMMA_LAYER_NAMES
    return _PHI3_LAYER_NAMES if arch == "phi3" else {}


def refuse_unknown_keys(fields, arch: str) -> None:
    """Every `{arch}.` key must be one this converter reads (rope.scaling.*: gguf_rope_fields checks those);
    keys read only to check a value are checked here. ValueError names the first other one."""
    family = FAMILIES.get(arch)
    known = set(KEYS) | set(_FAMILY_KEYS.get(arch, ())) | set(family.keys if family else ())
    prefix = f"{arch}."
    extra = sorted(k for k in fields if k.startswith(prefix) and not k.startswith(prefix + "rope.scaling.")
                   and k[len(prefix):] not in known)
    if extra:
        raise ValueError(f"GGUF key {extra[0]!r} is not supported (architecture {arch})")
    get = lambda k: fields[prefix + k].contents() if prefix + k in fields else None  # noqa: E731
    key_len, value_len = get("attention.key_length"), get("attention.value_length")
    if value_len is not None and key_len is not None and int(value_len) != int(key_len) and not (
            family and family.head_dims):
        raise ValueError(f"GGUF {prefix}attention.value_length {value_len} != key_length {key_len} is not supported")
    gating = get("expert_gating_func")
    if gating is not None and int(gating) != _GATING_SOFTMAX and family is None:  # a family reads its own
        raise ValueError(f"GGUF {prefix}expert_gating_func {gating} is not supported (softmax routing only)")


def family_config(arch: str, a: Callable, names: set[str], base: dict) -> dict:
    """The whole config.json: the shared fields (`base`) with the arch's own; `a(key, default)` reads
    `{arch}.{key}`."""
    if arch in FAMILIES:
        return FAMILIES[arch].config(a, names, base)
    return {**base, **_family_fields(arch, a, names, base)} if arch not in NORM_PLUS_ONE else _gemma(arch, a, base)


def _family_fields(arch: str, a: Callable, names: set[str], base: dict) -> dict:
    layers = base["num_hidden_layers"]
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
    if arch == "smollm3":
        return {"no_rope_layers": [int((i + 1) % _SMOLLM3_NOPE_STEP != 0) for i in range(layers)]}
    return {}


_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}  # llama.cpp's 27B: scores scaled by (hidden / heads) ** -0.5


def _gemma(arch: str, a: Callable, base: dict) -> dict:
    """Gemma 2 / 3 config.json from the shared fields: GeGLU, soft-caps, windows per layer, the query scale;
    gemma3: rope_parameters per layer type (scaling on the global layers only, as llama.cpp applies it)."""
    out = dict(base)
    layers, hidden, heads = out["num_hidden_layers"], out["hidden_size"], out["num_attention_heads"]
    pattern = a("attention.sliding_window_pattern", 2 if arch == "gemma2" else 6)
    if isinstance(pattern, list):  # per layer: True slides
        if len(pattern) != layers:
            raise ValueError(f"GGUF {arch}.attention.sliding_window_pattern has {len(pattern)} entries for "
                             f"{layers} layers")
        slides = [bool(p) for p in pattern]
    else:  # llama.cpp's set_swa_pattern(n): every n-th layer is global (0: none, 1: all)
        n = int(pattern)
        slides = [n == 0 or i % n < n - 1 for i in range(layers)]
    window = a("attention.sliding_window", 4096 if arch == "gemma2" else None)
    if window is None and any(slides):
        raise ValueError(f"GGUF {arch}: sliding layers but no {arch}.attention.sliding_window")
    scalar = hidden // heads if layers == _GEMMA_27B_LAYERS[arch] else out["head_dim"]
    out.update(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
               query_pre_attn_scalar=scalar, sliding_window=None if window is None else int(window),
               layer_types=["sliding_attention" if s else "full_attention" for s in slides],
               attn_logit_softcapping=_float_or_none(a("attn_logit_softcapping")),
               final_logit_softcapping=_float_or_none(a("final_logit_softcapping")))
    if arch == "gemma3":
        full = {"rope_type": "default", "rope_theta": out.pop("rope_theta"), **(out.pop("rope_scaling", None) or {})}
        local = {"rope_type": "default", "rope_theta": float(a("rope.freq_base_swa", 10000.0))}
        out["rope_parameters"] = {"full_attention": full, "sliding_attention": local}
    return out


def _float_or_none(v) -> Optional[float]:
    return None if v is None else float(v)


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
    if arch in ("llama", "llama4") and set(data) == {"rope_freqs.weight"}:
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
