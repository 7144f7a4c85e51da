"""llama.cpp's `qwen3next` (Qwen3-Next) -> Qwen3NextForCausalLM.

What llama.cpp's converter (convert_hf_to_gguf.py Qwen3NextModel) writes, undone: the Gated DeltaNet's in_proj_qkvz
(per key head [q, k, v, z]) regrouped into attn_qkv (all q, all k, all v) and attn_gate (z), A_log stored as ssm_a =
-exp(A_log), dt_bias as ssm_dt.bias, conv1d squeezed to [channels, kernel], every RMSNorm but the DeltaNet's gated
one stored as 1 + w (the model's zero-centred norms); the geometry in ssm.* (conv_kernel, state_size = key head dim,
group_count = key heads, time_step_rank = value heads, inner_size = value heads x value head dim), the layer pattern
in attention.recurrent_layers (else full_attention_interval), Qwen2-MoE's experts with the gated shared expert;
prediction layers appended after the decoder are left unread.
"""

from __future__ import annotations

import numpy as np

from radixlang_runtime.model.loader.gguf_family import GGUFFamily, stacked_experts

KEYS = ("expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_feed_forward_length",
        "expert_weights_norm", "ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank",
        "ssm.inner_size", "full_attention_interval", "attention.recurrent_layers", "nextn_predict_layers")
_LA = "linear_attn."
LAYER_NAMES = stacked_experts({
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    "attn_qkv.weight": _LA + "qkv.weight", "attn_gate.weight": _LA + "z.weight", "ssm_a": _LA + "A_log",
    "ssm_dt.bias": _LA + "dt_bias", "ssm_conv1d.weight": _LA + "conv1d.weight",
    "ssm_ba.weight": _LA + "in_proj_ba.weight",
    "ssm_norm.weight": _LA + "norm.weight", "ssm_out.weight": _LA + "out_proj.weight",
})


def _config(a, names: set, base: dict) -> dict:
    nextn = int(a("nextn_predict_layers", 0))
    layers = base["num_hidden_layers"] - nextn
    k_heads, v_heads = int(a("ssm.group_count")), int(a("ssm.time_step_rank"))
    out = dict(base, num_hidden_layers=layers, num_experts=int(a("expert_count")),
               num_experts_per_tok=int(a("expert_used_count")),
               moe_intermediate_size=int(a("expert_feed_forward_length")),
               shared_expert_intermediate_size=int(a("expert_shared_feed_forward_length", 0)),
               norm_topk_prob=bool(a("expert_weights_norm", True)), decoder_sparse_step=1, mlp_only_layers=[],
               linear_conv_kernel_dim=int(a("ssm.conv_kernel")), linear_key_head_dim=int(a("ssm.state_size")),
               linear_num_key_heads=k_heads, linear_num_value_heads=v_heads,
               linear_value_head_dim=int(a("ssm.inner_size")) // v_heads)
    recurrent = a("attention.recurrent_layers")
    if recurrent is not None:
        out["layer_types"] = ["linear_attention" if r else "full_attention" for r in list(recurrent)[:layers]]
    else:
        out["full_attention_interval"] = int(a("full_attention_interval", 4))
    out.setdefault("partial_rotary_factor", 1.0)  # rope.dimension_count == head_dim: the whole head rotates
    return out


def _tensors(out: dict, config: dict) -> None:
    """attn_qkv + attn_gate -> in_proj_qkvz (per key head q, k, v, z), ssm_a -> A_log, conv1d [C, 1, K], the
    1 + w norms back to w; in place."""
    nk, dk = config["linear_num_key_heads"], config["linear_key_head_dim"]
    vz = config["linear_num_value_heads"] // nk * config["linear_value_head_dim"]  # v (and z) rows per key head
    for name in [n for n in out if n.endswith(_LA + "qkv.weight")]:
        p = name[: -len("qkv.weight")]
        qkv, z = out.pop(name), out.pop(p + "z.weight")
        hidden = qkv.shape[1]
        q, k, v = qkv[: nk * dk], qkv[nk * dk: 2 * nk * dk], qkv[2 * nk * dk:]
        parts = [q.reshape(nk, dk, hidden), k.reshape(nk, dk, hidden), v.reshape(nk, vz, hidden),
                 z.reshape(nk, vz, hidden)]
        out[p + "in_proj_qkvz.weight"] = np.ascontiguousarray(np.concatenate(parts, axis=1).reshape(-1, hidden))
    for name in list(out):
        if name.endswith(_LA + "A_log"):
            out[name] = np.log(-out[name].astype(np.float64)).astype(np.float32)
        elif name.endswith(_LA + "conv1d.weight"):
            out[name] = out[name].reshape(out[name].shape[0], 1, -1)
        elif name.endswith("norm.weight") and not name.endswith(_LA + "norm.weight"):
            out[name] = out[name] - np.float32(1.0)


FAMILY = GGUFFamily(arch="qwen3next", hf_arch="Qwen3NextForCausalLM", model_type="qwen3_next", keys=KEYS,
                    layer_names=LAYER_NAMES, config=_config, tensors=_tensors, extra_blocks=True)
