"""GGUFFamily: what one GGUF architecture served by its own native model (deepseek2, glm4moe, gpt-oss, granitehybrid,
llama4, nemotron_h / nemotron_h_moe, qwen3next) adds to the shared llama mapping (gguf_convert.py): its HF
architecture, the `{arch}.` keys it reads, its tensor names, its config.json and the tensor reshapes that undo
llama.cpp's converter. No torch."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

# a(key, default) reads `{arch}.{key}`; names: the file's tensor names; base: the shared config.json fields
ConfigFn = Callable[[Callable, set, dict], dict]
# the HF-named float32 tensors after the shared mapping (gguf_convert.gguf_state_dict), changed in place
TensorsFn = Callable[[dict, dict], None]


@dataclass(frozen=True)
class GGUFFamily:
    arch: str  # llama.cpp's general.architecture (gguf.MODEL_ARCH_NAMES)
    hf_arch: str  # the architecture config.json names (a config function may pick another, e.g. V2 / V3)
    model_type: str
    keys: tuple[str, ...]  # `{arch}.` keys read beyond gguf_families.KEYS; every other one is refused by name
    layer_names: dict[str, str]  # blk.N.{suffix} -> model.layers.N.{HF suffix} (they win over llama's)
    config: ConfigFn
    tensors: Optional[TensorsFn] = None
    head_dims: bool = False  # attention.key_length / value_length are the family's (no shared equality check)
    rope_scaling_keys: tuple[str, ...] = ()  # rope.scaling.* keys the family reads itself
    extra_blocks: bool = False  # blk.N past num_hidden_layers (multi-token prediction layers) are left unread
    # attention.head_count_kv / feed_forward_length may be per layer, 0 on a layer without attention / a
    # feed-forward (llama.cpp's hybrids): the family reads the layer pattern from them
    per_layer: bool = False


def per_layer_count(key: str, value, default: int, arch: str, family: Optional[GGUFFamily]) -> int:
    """A count that llama.cpp may write per layer (attention.head_count_kv, feed_forward_length; absent:
    `default`) as config.json's one number: a per-layer array must give every layer that has one the same
    count, and has 0 entries only where the family reads the layer pattern from it. ValueError names what is
    not honoured."""
    if value is None:
        return default
    if not isinstance(value, list):
        return int(value)
    counts = sorted({int(v) for v in value} - {0})
    if len(counts) < len(value) and not (family and family.per_layer):
        raise ValueError(f"GGUF {arch}.{key} with 0 entries (layers without one) is not supported")
    if len(counts) > 1:
        raise ValueError(f"GGUF {arch}.{key} per layer {counts} is not supported (one count for every layer "
                         "that has one)")
    return counts[0] if counts else default


def unread_block(family: Optional[GGUFFamily], name: str, config: dict) -> bool:
    """Whether `name` is a tensor of a block past the decoder's layers that the family leaves unread."""
    m = re.match(r"blk\.(\d+)\.", name)
    return bool(family and family.extra_blocks and m and int(m.group(1)) >= config["num_hidden_layers"])


YARN_BETA_KEYS = ("yarn_beta_fast", "yarn_beta_slow")


def yarn_betas(a, scaling: dict) -> dict:
    """`scaling` (yarn) with rope.scaling.yarn_beta_fast / yarn_beta_slow as transformers' beta_fast / beta_slow."""
    out = dict(scaling)
    for key, name in zip(YARN_BETA_KEYS, ("beta_fast", "beta_slow")):
        if a(f"rope.scaling.{key}") is not None:
            out[name] = float(a(f"rope.scaling.{key}"))
    return out


def stacked_experts(names: dict[str, str]) -> dict[str, str]:
    """The MoE tensor names llama.cpp writes for a router and stacked experts (gate / up joined afterwards by
    gguf_families.join_experts)."""
    return {"ffn_gate_inp.weight": "mlp.gate.weight", "ffn_gate_exps.weight": "mlp.experts.gate_proj",
            "ffn_up_exps.weight": "mlp.experts.up_proj", "ffn_down_exps.weight": "mlp.experts.down_proj", **names}


def check_blocks(arch: str, types: list[str], names: set, needs: dict[str, str]) -> None:
    """Each layer holds the tensor its type needs (`needs`: layer type -> blk suffix): a pattern read from
    per-layer counts that does not describe the file's tensors (llama.cpp could not load it either) is refused
    naming the first block that contradicts it."""
    for i, t in enumerate(types):
        if t in needs and f"blk.{i}.{needs[t]}" not in names:
            raise ValueError(f"GGUF {arch}: blk.{i} has no {needs[t]} but its per-layer counts make it a {t} block")


def undo_mamba2_hybrid(out: dict, config: dict, attn: str, mamba: str) -> None:
    """What llama.cpp's converter did to a Mamba2 hybrid's tensors, undone in place: the q / k rows (and biases)
    under `attn` unpermuted; under `mamba`, A (stored as -exp(A_log)) -> A_log, D and the grouped norm ([H, 1] /
    [G, n]) flattened, the squeezed conv1d [C, K] -> [C, 1, K]."""
    import numpy as np

    from radixlang_runtime.model.loader.gguf_convert import unpermute_rotary_rows  # (it imports the families)

    for name in list(out):
        w = out[name]
        if name.endswith((attn + "q_proj.weight", attn + "q_proj.bias")):
            out[name] = unpermute_rotary_rows(w, config["num_attention_heads"])
        elif name.endswith((attn + "k_proj.weight", attn + "k_proj.bias")):
            out[name] = unpermute_rotary_rows(w, config["num_key_value_heads"])
        elif name.endswith(mamba + "A_log"):
            out[name] = np.log(-w.astype(np.float64)).astype(np.float32).reshape(-1)
        elif name.endswith((mamba + "D", mamba + "norm.weight")):
            out[name] = w.reshape(-1)
        elif name.endswith(mamba + "conv1d.weight"):
            out[name] = w.reshape(w.shape[0], 1, -1)
