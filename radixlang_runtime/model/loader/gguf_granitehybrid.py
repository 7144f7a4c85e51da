"""llama.cpp's `granitehybrid` (Granite 4.0-H) -> GraniteMoeHybridForCausalLM.

What llama.cpp's converter (convert_hf_to_gguf.py GraniteHybridModel, with Mamba2Model's and GraniteMoeModel's
tensor changes) writes, undone:
- the layer pattern in attention.head_count_kv, one entry per layer: 0 on a Mamba2 layer, the KV heads on an
  attention layer;
- Mamba2: dt_bias as ssm_dt.bias, A_log stored as ssm_a = -exp(A_log) and D as ssm_d, both [heads, 1], conv1d
  squeezed to ssm_conv1d [channels, kernel], the gated norm's weight grouped as ssm_norm [groups, inner / groups];
  the sizes in ssm.* (conv_kernel, state_size, group_count, time_step_rank = heads, inner_size = heads x head
  dim). Biases (ssm_in / ssm_out / ssm_conv1d .bias) are read where the file has them;
- attention: q / k rows (and biases) permuted as llama's (undo_permute), the scores' scale in attention.scale
  (absent: head_dim ** -0.5, llama.cpp's default); rope or none by rope.scaling.finetuned (llama.cpp's switch:
  the converter writes false for a hybrid, whose attention has no positions; absent: rope);
- Granite's multipliers: embedding_scale, residual_scale, logit_scale (absent: 1);
- the shared MLP's input_linear [2I, hidden] (gate rows, then up) split into ffn_gate_shexp / ffn_up_shexp with
  experts (its width in expert_shared_feed_forward_length), ffn_gate / ffn_up / ffn_down without (expert_count 0);
  the experts' input_linear [E, 2I, hidden] split into ffn_gate_exps / ffn_up_exps, the router as ffn_gate_inp.

The converted directory carries transformers 5's names (block_sparse_moe.experts.gate_up_proj / down_proj,
router.weight). mamba_chunk_size is not in the file (a prefill's chunking does not change the math): the
transformers default.
"""

from __future__ import annotations

import numpy as np

from radixlang_runtime.model.loader.gguf_family import GGUFFamily, check_blocks, undo_mamba2_hybrid

KEYS = ("expert_count", "expert_used_count", "expert_shared_feed_forward_length", "attention.scale",
        "embedding_scale", "residual_scale", "logit_scale", "ssm.conv_kernel", "ssm.state_size", "ssm.group_count",
        "ssm.time_step_rank", "ssm.inner_size")
_M, _MOE, _SH = "mamba.", "block_sparse_moe.", "shared_mlp."
LAYER_NAMES = {
    "ssm_in.weight": _M + "in_proj.weight", "ssm_in.bias": _M + "in_proj.bias",
    "ssm_conv1d.weight": _M + "conv1d.weight", "ssm_conv1d.bias": _M + "conv1d.bias",
    "ssm_dt.bias": _M + "dt_bias", "ssm_a": _M + "A_log", "ssm_d": _M + "D", "ssm_norm.weight": _M + "norm.weight",
    "ssm_out.weight": _M + "out_proj.weight", "ssm_out.bias": _M + "out_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    # the shared MLP: dense (no experts) or the shared expert; gate / up joined into input_linear by _tensors
    "ffn_gate.weight": _SH + "gate", "ffn_up.weight": _SH + "up", "ffn_down.weight": _SH + "output_linear.weight",
    "ffn_gate_shexp.weight": _SH + "gate", "ffn_up_shexp.weight": _SH + "up",
    "ffn_down_shexp.weight": _SH + "output_linear.weight",
    "ffn_gate_inp.weight": _MOE + "router.weight", "ffn_gate_exps.weight": _MOE + "experts.gate",
    "ffn_up_exps.weight": _MOE + "experts.up", "ffn_down_exps.weight": _MOE + "experts.down_proj",
}


def _config(a, names: set, base: dict) -> dict:
    layers, hidden = base["num_hidden_layers"], base["hidden_size"]
    kv = a("attention.head_count_kv")
    per_layer = [int(v) for v in kv] if isinstance(kv, list) else [base["num_key_value_heads"]] * layers
    if len(per_layer) != layers:
        raise ValueError(f"GGUF granitehybrid.attention.head_count_kv has {len(per_layer)} entries for {layers} "
                         "layers")
    types = ["attention" if n else "mamba" for n in per_layer]
    check_blocks("granitehybrid", types, names, {"mamba": "ssm_in.weight", "attention": "attn_q.weight"})
    heads, inner = int(a("ssm.time_step_rank")), int(a("ssm.inner_size"))
    if inner % heads:
        raise ValueError(f"GGUF granitehybrid.ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {heads}")
    first_m = next((i for i, t in enumerate(types) if t == "mamba"), 0)
    first_a = next((i for i, t in enumerate(types) if t == "attention"), 0)
    shared = int(a("expert_shared_feed_forward_length", base["intermediate_size"]))
    expand = inner / hidden
    out = dict(base, layer_types=types, num_local_experts=int(a("expert_count", 0)),
               num_experts_per_tok=int(a("expert_used_count", 0)), shared_intermediate_size=shared,
               attention_bias=f"blk.{first_a}.attn_q.bias" in names,
               attention_multiplier=float(a("attention.scale", base["head_dim"] ** -0.5)),
               embedding_multiplier=float(a("embedding_scale", 1.0)),
               residual_multiplier=float(a("residual_scale", 1.0)), logits_scaling=float(a("logit_scale", 1.0)),
               position_embedding_type="rope" if a("rope.scaling.finetuned", True) else "nope",
               mamba_n_heads=heads, mamba_d_head=inner // heads, mamba_expand=int(expand) if expand.is_integer()
               else expand, mamba_d_state=int(a("ssm.state_size")), mamba_n_groups=int(a("ssm.group_count")),
               mamba_d_conv=int(a("ssm.conv_kernel")), mamba_conv_bias=f"blk.{first_m}.ssm_conv1d.bias" in names,
               mamba_proj_bias=f"blk.{first_m}.ssm_in.bias" in names, normalization_function="rmsnorm")
    return out


def _tensors(out: dict, config: dict) -> None:
    """q / k rows unpermuted, ssm_a -> A_log, D / A [H, 1] -> [H], conv1d [C, K] -> [C, 1, K], the grouped norm
    flattened, gate / up joined (gate rows first): the shared MLP's input_linear, the experts' gate_up_proj;
    in place."""
    undo_mamba2_hybrid(out, config, "self_attn.", _M)
    for gate in [n for n in out if n.endswith((_SH + "gate", _MOE + "experts.gate"))]:
        p = gate[: -len("gate")]
        joined = np.concatenate([out.pop(gate), out.pop(p + "up")], axis=-2)
        out[p + ("input_linear.weight" if p.endswith(_SH) else "gate_up_proj")] = np.ascontiguousarray(joined)


FAMILY = GGUFFamily(arch="granitehybrid", hf_arch="GraniteMoeHybridForCausalLM", model_type="granitemoehybrid",
                    keys=KEYS, layer_names=LAYER_NAMES, config=_config, tensors=_tensors, per_layer=True)
