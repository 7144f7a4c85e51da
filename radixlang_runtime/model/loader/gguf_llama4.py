"""llama.cpp's `llama4` (Llama 4 Scout / Maverick text, MobileLLM-R1) -> Llama4ForCausalLM.

What llama.cpp's converter (convert_hf_to_gguf.py Llama4Model) writes, undone: q / k as they are (no rotary
permutation: the interleaved pairs Llama 4 rotates), the experts' gate_up_proj [E, hidden, 2I] (gate columns
first) split and transposed into ffn_gate_exps / ffn_up_exps [E, I, hidden], down_proj [E, I, hidden]
transposed into ffn_down_exps; the dense MLPs' width in feed_forward_length (intermediate_size_mlp), the
experts' in expert_feed_forward_length; MoE every interleave_moe_layer_step-th layer with the shared expert.

What llama.cpp fixes rather than reads, taken the same way: attention.sliding_window 0 (MobileLLM) means full
attention with RoPE in every layer; otherwise chunks of 8,192 positions on three layers of four, the fourth a
NoPE layer with temperature tuning (floor 8,192, scale 0.1), and the L2 q / k norm on the RoPE layers except in
the 128-expert model (Maverick). rope_freqs (Llama 3.x scaling) is read as for llama.
"""

from __future__ import annotations

import numpy as np

from radixlang_runtime.model.loader.gguf_family import GGUFFamily

KEYS = ("expert_count", "expert_used_count", "expert_feed_forward_length", "interleave_moe_layer_step",
        "attention.sliding_window", "rope.freq_base_swa")
_CHUNK, _NOPE_STEP = 8192, 4  # llama.cpp's llama4 hparams
_FF = "feed_forward."
LAYER_NAMES = {
    "ffn_gate.weight": _FF + "gate_proj.weight", "ffn_up.weight": _FF + "up_proj.weight",
    "ffn_down.weight": _FF + "down_proj.weight", "ffn_gate_inp.weight": _FF + "router.weight",
    "ffn_gate_exps.weight": _FF + "experts.gate.weight", "ffn_up_exps.weight": _FF + "experts.up.weight",
    "ffn_down_exps.weight": _FF + "experts.down.weight",
    "ffn_gate_shexp.weight": _FF + "shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": _FF + "shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": _FF + "shared_expert.down_proj.weight",
}


def _config(a, names: set, base: dict) -> dict:
    layers, theta = base["num_hidden_layers"], base["rope_theta"]
    swa_theta = a("rope.freq_base_swa")
    if swa_theta is not None and float(swa_theta) != theta:
        raise ValueError(f"GGUF llama4.rope.freq_base_swa {swa_theta} != rope.freq_base {theta} is not supported "
                         "(Llama 4 rotates every RoPE layer alike)")
    experts = int(a("expert_count", 0))
    if experts == 0:
        raise ValueError("GGUF llama4 without experts (expert_count 0) is not supported")
    chunked = int(a("attention.sliding_window", _CHUNK)) != 0
    rope = [int(not chunked or (i + 1) % _NOPE_STEP != 0) for i in range(layers)]
    out = dict(base, architectures=["Llama4ForCausalLM"], model_type="llama4_text",
               intermediate_size_mlp=base["intermediate_size"],
               intermediate_size=int(a("expert_feed_forward_length")), num_local_experts=experts,
               num_experts_per_tok=int(a("expert_used_count", 1)),
               interleave_moe_layer_step=int(a("interleave_moe_layer_step", 1)), no_rope_layers=rope,
               attention_chunk_size=_CHUNK if chunked else None,
               layer_types=["chunked_attention" if chunked and r else "full_attention" for r in rope],
               use_qk_norm=experts != 128, attn_temperature_tuning=True, floor_scale=_CHUNK, attn_scale=0.1)
    return out


def _tensors(out: dict, config: dict) -> None:
    """gate / up [E, I, hidden] -> feed_forward.experts.gate_up_proj [E, hidden, 2I] (gate columns first), down
    [E, hidden, I] -> down_proj [E, I, hidden]; in place."""
    for gate_name in [n for n in out if n.endswith("experts.gate.weight")]:
        p = gate_name[: -len("gate.weight")]
        gate_up = np.concatenate([out.pop(p + "gate.weight"), out.pop(p + "up.weight")], axis=1)
        out[p + "gate_up_proj"] = np.ascontiguousarray(gate_up.transpose(0, 2, 1))
        out[p + "down_proj"] = np.ascontiguousarray(out.pop(p + "down.weight").transpose(0, 2, 1))


FAMILY = GGUFFamily(arch="llama4", hf_arch="Llama4ForCausalLM", model_type="llama4_text", keys=KEYS,
                    layer_names=LAYER_NAMES, config=_config, tensors=_tensors)
