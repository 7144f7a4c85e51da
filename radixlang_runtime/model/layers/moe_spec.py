"""MoESpec: what a mixture-of-experts config.json asks of the feed-forward blocks (model/layers/moe.py runs it).

The routing is transformers' TopKRouter for all four families here (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE):
router logits in the model dtype, softmax in float32 over all experts, top-k of the probabilities, then
(always for Mixtral, with norm_topk_prob for the others) renormalised over the k. Mixtral multiplies the
expert outputs by the float32 weights; the others round the weights to the model dtype first.

Config fields that only matter when training are accepted and have no effect, as in transformers' eval
mode: router_aux_loss_coef (the load-balancing loss), router_jitter_noise (Mixtral: multiplicative noise,
applied only under module.training), attention_dropout. output_router_logits true asks the forward for
the router logits (and the auxiliary loss), which nothing here returns: refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from radixlang_runtime.model.layers.moe_routing import RoutingSpec


@dataclass(frozen=True)
class MoESpec:
    num_experts: int  # E
    top_k: int  # experts per token (num_experts_per_tok)
    expert_intermediate_size: int  # I of each expert: gate_up [E, 2I, hidden], down [E, hidden, I]
    norm_topk_prob: bool  # renormalise the top-k probabilities to sum to 1
    weights_float32: bool  # Mixtral: expert outputs scaled by float32 weights (else rounded to the model dtype)
    shared_intermediate_size: int  # Qwen2-MoE: a dense shared expert with a sigmoid gate; 0: none
    sparse_layers: tuple[bool, ...]  # per layer: MoE block (True) or the dense MLP of intermediate_size (False)
    block: str  # the checkpoint's module name of the block: "mlp" or Mixtral's "block_sparse_moe"
    expert_names: tuple[str, str, str]  # per-expert tensor names of gate, up, down: gate_proj.. or w1, w3, w2
    # gpt-oss (GptOssTopKRouter / GptOssExperts): the router linear has a bias and the softmax runs over the
    # top-k logits (in the model dtype); the experts' gate_up and down carry biases; the activation is the
    # clamped SwiGLU (up.clamp(-limit, limit) + 1) * g * sigmoid(alpha g), g = gate.clamp(max=limit).
    router_bias: bool = False
    softmax_after_topk: bool = False
    expert_bias: bool = False
    swiglu_limit: Optional[float] = None  # with swiglu_alpha: the clamped SwiGLU; None: silu(gate) * up
    swiglu_alpha: Optional[float] = None
    # DeepSeek / GLM-4.5 routing (model/layers/moe_routing.py); None: the softmax top-k router above
    routing: Optional[RoutingSpec] = None
    shared_name: str = "shared_expert"  # the shared expert's module name (DeepSeek: "shared_experts")
    shared_gated: bool = True  # Qwen2-MoE: sigmoid(shared_expert_gate) scales it; DeepSeek: added as it is


def parse_moe(cfg: dict, arch: str, *, experts_key: str, default_experts: int, default_top_k: int,
              inter_key: str, default_inter: int, norm_topk_prob: bool, weights_float32: bool = False,
              shared_intermediate_size: int = 0, sparse_layers: tuple[bool, ...] = (), block: str = "mlp",
              expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")) -> MoESpec:
    """The MoE fields of config.json (the family passes transformers' keys and defaults); ValueError names a
    field that is not honoured."""
    if cfg.get("output_router_logits"):
        raise ValueError(f"output_router_logits true is not supported ({arch}: router logits and the auxiliary "
                         "loss are not returned)")
    experts = int(cfg.get(experts_key, default_experts))
    top_k = int(cfg.get("num_experts_per_tok", default_top_k))
    if experts > 0 and not 1 <= top_k <= experts:
        raise ValueError(f"num_experts_per_tok {top_k} must be between 1 and the {experts} experts ({arch})")
    layers = cfg["num_hidden_layers"]
    return MoESpec(num_experts=experts, top_k=top_k, expert_intermediate_size=int(cfg.get(inter_key, default_inter)),
                   norm_topk_prob=norm_topk_prob, weights_float32=weights_float32,
                   shared_intermediate_size=shared_intermediate_size,
                   sparse_layers=sparse_layers or (experts > 0,) * layers, block=block, expert_names=expert_names)


def qwen_sparse_layers(cfg: dict, experts: int) -> tuple[bool, ...]:
    """Qwen2-MoE / Qwen3-MoE: layer i is sparse unless listed in mlp_only_layers, when there are experts and
    (i + 1) is a multiple of decoder_sparse_step (transformers' DecoderLayer.__init__)."""
    dense = set(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step", 1))
    if step < 1:
        raise ValueError(f"decoder_sparse_step {step} must be >= 1")
    return tuple(i not in dense and experts > 0 and (i + 1) % step == 0 for i in range(cfg["num_hidden_layers"]))
