"""llama.cpp's `gpt-oss` -> GptOssForCausalLM.

What llama.cpp's converter (convert_hf_to_gguf.py GptOssModel) writes, undone: the experts' gate_up_proj
[E, hidden, 2I] (gate / up interleaved by column) and its bias split into ffn_gate_exps / ffn_up_exps
[E, I, hidden] (+ .bias [E, I]), down_proj [E, I, hidden] transposed into ffn_down_exps [E, hidden, I]; the
router with its bias (ffn_gate_inp), the sinks (attn_sinks), q / k / v / o biases, the pre-FFN norm as
post_attention_norm. Layers alternate sliding / full as llama.cpp's default pattern (every second layer global,
the first slides: transformers' layer_types), the window from attention.sliding_window; yarn's betas from
rope.scaling.yarn_beta_*, without truncation (GptOssConfig's rope). The clamped SwiGLU's constants are the
ones llama.cpp and transformers both fix (alpha 1.702, limit 7). The released files keep the experts in MXFP4
(gguf_convert.BLOCK_TYPES: dequantized at load, as every MoE model's experts are).
"""

from __future__ import annotations

import numpy as np

from radixlang_runtime.model.loader.gguf_family import YARN_BETA_KEYS, GGUFFamily, yarn_betas

KEYS = ("expert_count", "expert_used_count", "expert_feed_forward_length", "attention.sliding_window")

LAYER_NAMES = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_output.bias": "self_attn.o_proj.bias", "attn_sinks.weight": "self_attn.sinks",
    "ffn_gate_inp.weight": "mlp.router.weight", "ffn_gate_inp.bias": "mlp.router.bias",
    # joined into transformers' layout by _tensors (names join_experts leaves alone)
    "ffn_gate_exps.weight": "mlp.experts.gate.weight", "ffn_gate_exps.bias": "mlp.experts.gate.bias",
    "ffn_up_exps.weight": "mlp.experts.up.weight", "ffn_up_exps.bias": "mlp.experts.up.bias",
    "ffn_down_exps.weight": "mlp.experts.down.weight", "ffn_down_exps.bias": "mlp.experts.down_proj_bias",
}


def _config(a, names: set, base: dict) -> dict:
    layers = base["num_hidden_layers"]
    out = dict(base, num_local_experts=int(a("expert_count")), num_experts_per_tok=int(a("expert_used_count")),
               intermediate_size=int(a("expert_feed_forward_length")),
               sliding_window=int(a("attention.sliding_window")),
               layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
               attention_bias="blk.0.attn_q.bias" in names, swiglu_alpha=1.702, swiglu_limit=7.0)
    scaling = out.pop("rope_scaling", None)
    if scaling is not None:
        if scaling["rope_type"] != "yarn":
            raise ValueError(f"GGUF gpt-oss rope scaling {scaling['rope_type']!r} is not supported (yarn)")
        scaling = {**yarn_betas(a, scaling), "truncate": False}
    out["rope_parameters"] = {"rope_type": "default", **(scaling or {}), "rope_theta": out.pop("rope_theta")}
    return out


def _tensors(out: dict, config: dict) -> None:
    """The stacked gate / up / down (+ biases) -> transformers' gate_up_proj [E, hidden, 2I] interleaved,
    gate_up_proj_bias [E, 2I], down_proj [E, I, hidden]; in place."""
    for gate_name in [n for n in out if n.endswith("mlp.experts.gate.weight")]:
        p = gate_name[: -len("gate.weight")]
        gate, up = out.pop(p + "gate.weight"), out.pop(p + "up.weight")  # [E, I, hidden]
        gu = np.empty((gate.shape[0], gate.shape[2], 2 * gate.shape[1]), np.float32)
        gu[:, :, 0::2], gu[:, :, 1::2] = gate.transpose(0, 2, 1), up.transpose(0, 2, 1)
        out[p + "gate_up_proj"] = gu
        gb, ub = out.pop(p + "gate.bias"), out.pop(p + "up.bias")  # [E, I]
        gub = np.empty((gb.shape[0], 2 * gb.shape[1]), np.float32)
        gub[:, 0::2], gub[:, 1::2] = gb, ub
        out[p + "gate_up_proj_bias"] = gub
        out[p + "down_proj"] = np.ascontiguousarray(out.pop(p + "down.weight").transpose(0, 2, 1))


FAMILY = GGUFFamily(arch="gpt-oss", hf_arch="GptOssForCausalLM", model_type="gpt_oss", keys=KEYS,
                    layer_names=LAYER_NAMES, config=_config, tensors=_tensors, rope_scaling_keys=YARN_BETA_KEYS)
