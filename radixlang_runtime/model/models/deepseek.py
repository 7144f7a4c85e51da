"""DeepSeek V2 (DeepseekV2ForCausalLM) and V3 (DeepseekV3ForCausalLM; Kimi K2 is V3's architecture): multi-head
latent attention (model/layers/mla_attention.py, the KV pool's latent layout) and MoE blocks with DeepSeek routing
(model/layers/moe_routing.py) and shared experts, dense MLPs in the layers before first_k_dense_replace.

The fields are those transformers' DeepseekV2Config / DeepseekV3Config and modeling code read, with their
defaults. Fields of the original checkpoints' configs that transformers does not read are accepted where
they change nothing (ep_size, aux_loss_alpha, seq_aux, num_nextn_predict_layers: the multi-token-prediction
layers, which a plain forward never runs; speculative NEXTN runs the first, models/nextn.py) and refused by name
where the original code would compute something else (moe_layer_freq other than 1, a scoring_func / topk_method
the architecture's router does not run, V2's norm_topk_prob true: transformers' V2 router never renormalises).
"""

from __future__ import annotations

import dataclasses
import math
from torch import nn

from radixlang_runtime.model.loader.config import ModelConfig, base_config
from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.models.llama import Reduce
from radixlang_runtime.model.layers.mla_attention import MLAttention, mla_metadata
from radixlang_runtime.model.layers.mla_spec import MLASpec
from radixlang_runtime.model.models.moe_decoder import MoEForCausalLM
from radixlang_runtime.model.layers.moe_routing import RoutingSpec, check_routing
from radixlang_runtime.model.layers.moe_spec import parse_moe
from radixlang_runtime.model.executor.parallel import Shard
from radixlang_runtime.model.loader.weights import SafetensorsDir, param_setter

V2_DEFAULTS = {"vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
               "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "bos_token_id": 1,
               "eos_token_id": 2, "kv_lora_rank": 512, "q_lora_rank": 1536, "n_routed_experts": 64,
               "n_shared_experts": 2, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "routed_scaling_factor": 1.0, "topk_method": "greedy", "norm_topk_prob": False,
               "moe_intermediate_size": 1407, "first_k_dense_replace": 0}
V3_DEFAULTS = {"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
               "num_attention_heads": 128, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "bos_token_id": 0,
               "eos_token_id": 1, "kv_lora_rank": 512, "q_lora_rank": 1536, "n_routed_experts": 256,
               "n_shared_experts": 1, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
               "first_k_dense_replace": 3, "norm_topk_prob": True, "moe_intermediate_size": 2048,
               "rope_interleave": True}


def _mscale(factor: float, m: float) -> float:
    """transformers' yarn_get_mscale."""
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def _common(cfg: dict, arch: str) -> tuple[ModelConfig, MLASpec]:
    """What V2 and V3 share: the attention geometry, the rope (over qk_rope_head_dim lanes), the checks."""
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    if kv_heads != heads:  # transformers would repeat the expanded heads: the shapes do not meet
        raise ValueError(f"num_key_value_heads {kv_heads} is not supported ({arch}: the latent serves all "
                         f"{heads} heads)")
    if cfg.get("mlp_bias"):
        raise ValueError(f"mlp_bias true is not supported ({arch})")
    if int(cfg.get("moe_layer_freq", 1)) != 1:
        raise ValueError(f"moe_layer_freq {cfg['moe_layer_freq']} is not supported ({arch}: transformers makes "
                         "every layer from first_k_dense_replace on a MoE layer)")
    nope, rope_dim = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"])
    out = base_config({**cfg, "head_dim": rope_dim}, arch, attention_bias=bool(cfg.get("attention_bias", False)),
                      qk_norm=False, sliding_window=None)
    scale = (nope + rope_dim) ** -0.5
    r = out.rope
    if r.rope_type != "default" and r.mscale_all_dim:  # transformers' yarn_apply_mscale
        scale *= _mscale(r.factor, r.mscale_all_dim) ** 2
    q_lora = cfg.get("q_lora_rank")
    mla = MLASpec(q_lora_rank=None if q_lora is None else int(q_lora), kv_lora_rank=int(cfg["kv_lora_rank"]),
                  qk_nope_head_dim=nope, qk_rope_head_dim=rope_dim, v_head_dim=int(cfg["v_head_dim"]),
                  softmax_scale=scale, rope_interleave=bool(cfg.get("rope_interleave", True)))
    out = dataclasses.replace(out, head_dim=nope + rope_dim, num_key_value_heads=heads, mla=mla)
    return out, mla


def deepseek_moe(cfg: dict, arch: str, routing: RoutingSpec, out: ModelConfig) -> ModelConfig:
    """out with DeepSeek's MoE blocks: routed experts (hub or stacked tensors), the shared experts added as they
    are, dense MLPs in the layers before first_k_dense_replace."""
    for key in ("n_routed_experts", "num_experts_per_tok"):
        if cfg.get(key) is None:
            raise ValueError(f"{key} is required ({arch})")
    experts, layers = int(cfg["n_routed_experts"]), cfg["num_hidden_layers"]
    first = int(cfg.get("first_k_dense_replace") or 0)
    inter = int(cfg["moe_intermediate_size"])
    moe = parse_moe(cfg, arch, experts_key="n_routed_experts", default_experts=experts, default_top_k=1,
                    inter_key="moe_intermediate_size", default_inter=inter, norm_topk_prob=routing.norm_topk_prob,
                    weights_float32=True, shared_intermediate_size=inter * int(cfg.get("n_shared_experts") or 0),
                    sparse_layers=tuple(i >= first for i in range(layers)))
    check_routing(routing, experts, moe.top_k, arch)
    return dataclasses.replace(out, moe=dataclasses.replace(moe, routing=routing, shared_name="shared_experts",
                                                            shared_gated=False))


def parse_deepseek_v2(cfg: dict) -> ModelConfig:
    arch = "DeepseekV2ForCausalLM"
    cfg = {**V2_DEFAULTS, **cfg}
    if cfg.get("scoring_func", "softmax") != "softmax":
        raise ValueError(f"scoring_func {cfg['scoring_func']!r} is not supported ({arch}: softmax)")
    if cfg.get("norm_topk_prob"):
        raise ValueError(f"norm_topk_prob true is not supported ({arch}: transformers' router does not renormalise)")
    method = cfg.get("topk_method") or "greedy"
    if method not in ("greedy", "group_limited_greedy"):
        raise ValueError(f"topk_method {method!r} is not supported ({arch}: greedy, group_limited_greedy)")
    if "rope_interleave" in cfg:
        raise ValueError(f"rope_interleave is not read by {arch} (its rope rotates adjacent pairs)")
    out, _ = _common({**cfg, "rope_interleave": True}, arch)
    grouped = method == "group_limited_greedy"
    routing = RoutingSpec(scoring="softmax", topk_method=method, n_group=int(cfg.get("n_group") or 1) if grouped
                          else 1, topk_group=int(cfg.get("topk_group") or 1) if grouped else 1,
                          routed_scaling_factor=float(cfg["routed_scaling_factor"]), norm_topk_prob=False,
                          correction_bias=False)
    return deepseek_moe(cfg, arch, routing, out)


def parse_deepseek_v3(cfg: dict) -> ModelConfig:
    arch = "DeepseekV3ForCausalLM"
    cfg = {**V3_DEFAULTS, **cfg}
    if cfg.get("scoring_func", "sigmoid") != "sigmoid":
        raise ValueError(f"scoring_func {cfg['scoring_func']!r} is not supported ({arch}: sigmoid)")
    if cfg.get("topk_method", "noaux_tc") != "noaux_tc":
        raise ValueError(f"topk_method {cfg['topk_method']!r} is not supported ({arch}: noaux_tc)")
    out, _ = _common(cfg, arch)
    return deepseek_moe(cfg, arch, v3_routing(cfg, arch), out)


def v3_routing(cfg: dict, arch: str) -> RoutingSpec:
    """DeepseekV3TopkRouter's (GLM-4.5's too): sigmoid scores, the correction bias, groups scored by their two
    best experts (cfg holds the family's defaults)."""
    routing = RoutingSpec(scoring="sigmoid", topk_method="noaux_tc", n_group=int(cfg["n_group"] or 1),
                          topk_group=int(cfg["topk_group"] or 1),
                          routed_scaling_factor=float(cfg["routed_scaling_factor"]),
                          norm_topk_prob=bool(cfg["norm_topk_prob"]), correction_bias=True)
    if int(cfg["n_routed_experts"]) // routing.n_group < 2:  # a group is scored by its two best experts
        raise ValueError(f"n_group {routing.n_group} leaves fewer than 2 experts per group ({arch})")
    return routing


class DeepseekForCausalLM(MoEForCausalLM):
    """The decoder with MLAttention in every layer; the MoE / dense blocks and their loading are MoEForCausalLM's."""

    @staticmethod
    def make_attention(cfg: ModelConfig, layer_id: int, shard: Shard, reduce: Reduce) -> nn.Module:
        return MLAttention(cfg, layer_id, shard, reduce)

    def enable_cpu_ops(self) -> None:
        """The CPU C kernels: the norms and the dense MLPs' activation, and the absorbed decode's attention (unless
        it runs in Triton)."""
        super().enable_cpu_ops()
        for layer in self.layers:
            layer.self_attn.use_cpu_kernel = not layer.self_attn.use_triton

    def use_triton_kernels(self) -> str:
        """The absorbed decode's attention through the Triton kernel (--attention-backend triton:
        radixlang_kernels/mla_decode_triton.py); returns the path's name in the logged CPU paths. ValueError where
        the latent is wider than the kernel takes."""
        from radixlang_kernels.mla_decode_triton import MAX_LATENT, MAX_ROPE

        m = self.cfg.mla
        if m.kv_lora_rank > MAX_LATENT or m.qk_rope_head_dim > MAX_ROPE:
            raise ValueError(f"attention_backend triton: the MLA decode kernel takes kv_lora_rank <= {MAX_LATENT} and "
                             f"qk_rope_head_dim <= {MAX_ROPE}; this model has {m.kv_lora_rank} and "
                             f"{m.qk_rope_head_dim} (attention_backend torch serves it)")
        for layer in self.layers:
            layer.self_attn.use_cpu_kernel, layer.self_attn.use_triton = False, True
        return "mla-absorbed:triton"

    def final_hidden(self, fb: ForwardBatch, rows=None):
        fb.attn_meta = mla_metadata(fb)  # the latent entries' indexing, once per step for every layer
        return super().final_hidden(fb, rows)

    def load_hf_state_dict(self, tensors: SafetensorsDir) -> None:
        own, done, put = param_setter(self)
        take = tensors.get
        vocab = (self.shard.vocab_start, self.shard.vocab_start + self.shard.vocab_count)  # this rank's rows
        put("embed_tokens.weight", take("model.embed_tokens.weight", rows=vocab))
        put("norm.weight", take("model.norm.weight"))
        if self.lm_head is not None:
            put("lm_head.weight", take("lm_head.weight", rows=vocab))
        for i in range(self.cfg.num_hidden_layers):
            src, dst = f"model.layers.{i}.", f"layers.{i}."
            self.layers[i].self_attn.load(take, put, src + "self_attn.", dst + "self_attn.", self.cfg.attention_bias)
            self.load_mlp(i, tensors, put)
            put(dst + "input_layernorm.weight", take(src + "input_layernorm.weight"))
            put(dst + "post_attention_layernorm.weight", take(src + "post_attention_layernorm.weight"))
            self.load_layer_extras(i, tensors, put)
            self.layers[i].self_attn.absorb()
        missing = sorted(set(own) - done)
        if missing:
            raise ValueError(f"parameters not loaded: {missing[:5]}")
