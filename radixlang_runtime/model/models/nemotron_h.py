"""Nemotron-H (NemotronHForCausalLM): a hybrid decoder of single-mixer blocks, each a norm, one mixer and the
residual add, as config.json's layers_block_type (or the older hybrid_override_pattern) says:

- "linear_attention" / M: Mamba2 (model/layers/mamba2.py: a recurrent state in the state pool, no KV);
- "full_attention" / *: softmax attention over the paged KV pool, without positions (no rope) and without biases;
- "mlp" / -: up_proj, relu(x)^2, down_proj (mlp_bias);
- "moe" / E: the routed experts (non-gated, relu^2) with DeepSeek V3's router (sigmoid scores, the correction bias
  for the choice, n_group / topk_group, norm_topk_prob, routed_scaling_factor; model/layers/moe_routing.py),
  through the moe_latent_size projections when set, plus the shared expert (a relu^2 MLP of
  moe_shared_expert_intermediate_size).

Norms are RMSNorms (weights as stored); the final one is norm_f. The multi-token-prediction layers (mtp.*) are not
loaded, as in transformers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.executor.parallel import Reduce, Shard
from radixlang_runtime.model.layers.attention.base import AttentionBackend
from radixlang_runtime.model.layers.hybrid_attention import HybridAttention
from radixlang_runtime.model.layers.mamba2 import Mamba2Mixer
from radixlang_runtime.model.layers.mamba2_spec import Mamba2Spec, make_mamba2
from radixlang_runtime.model.layers.moe import grouped_experts
from radixlang_runtime.model.layers.moe_routing import RoutingSpec, check_routing, route_grouped
from radixlang_runtime.model.layers.rms_norm import RMSNorm
from radixlang_runtime.model.loader.config import ModelConfig, base_config
from radixlang_runtime.model.loader.weights import SafetensorsDir, param_setter
from radixlang_runtime.model.models.mamba2_hybrid import Mamba2Hybrid
from radixlang_runtime.model.models.llama import LlamaForCausalLM

ARCH = "NemotronHForCausalLM"
PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
LEGACY = {"mamba": "linear_attention", "attention": "full_attention"}
_DEFAULTS = {"vocab_size": 131072, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
             "head_dim": 128, "max_position_embeddings": 4096, "intermediate_size": 21504}


@dataclass(frozen=True)
class NemotronOptions:
    """ModelConfig.family_options: each layer's block type and the MoE's sizes (None: no moe layer)."""

    layer_types: tuple[str, ...]
    mlp_bias: bool
    experts: int
    top_k: int
    expert_intermediate_size: int
    shared_intermediate_size: int
    latent_size: Optional[int]
    routing: Optional[RoutingSpec]


def _layer_types(cfg: dict) -> list[str]:
    types = cfg.get("layers_block_type") or cfg.get("layer_types")
    if types is None:
        pattern = cfg.get("hybrid_override_pattern")
        if pattern is None:
            return ["linear_attention", "moe", "full_attention", "mlp"]  # the config class's default
        unknown = sorted(set(pattern) - set(PATTERN))
        if unknown:
            raise ValueError(f"hybrid_override_pattern character {unknown[0]!r} is not supported ({ARCH}: M * - E)")
        return [PATTERN[c] for c in pattern]
    types = [LEGACY.get(t, t) for t in types]
    unknown = sorted(set(types) - set(PATTERN.values()))
    if unknown:
        raise ValueError(f"layers_block_type entry {unknown[0]!r} is not supported ({ARCH}: "
                         f"{', '.join(PATTERN.values())})")
    return types


def parse_nemotron_h(cfg: dict) -> ModelConfig:
    """config.json -> ModelConfig; ValueError names a field not honoured."""
    cfg = {**_DEFAULTS, **cfg}
    types = _layer_types(cfg)
    n = len(types)  # transformers derives the layer count from the types (num_hidden_layers is not read)
    for key, want in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
        if cfg.get(key, want) != want:
            raise ValueError(f"{key} {cfg[key]!r} is not supported ({ARCH}: {want})")
    for key in ("attention_bias", "output_router_logits"):
        if cfg.get(key):
            raise ValueError(f"{key} true is not supported ({ARCH}: transformers' NemotronH has none)")
    if cfg.get("sliding_window") is not None:
        raise ValueError(f"sliding_window {cfg['sliding_window']!r} is not supported ({ARCH}: full attention)")
    out = base_config({**cfg, "num_hidden_layers": n, "hidden_act": "silu", "rms_norm_eps":
                       cfg.get("layer_norm_epsilon", 1e-5), "rope_parameters": None, "rope_scaling": None},
                      ARCH, attention_bias=False, qk_norm=False, sliding_window=None)
    experts = int(cfg.get("n_routed_experts", cfg.get("num_local_experts", 8)))
    top_k = int(cfg.get("num_experts_per_tok", 2))
    routing = None
    if "moe" in types:
        routing = RoutingSpec(scoring="sigmoid", topk_method="noaux_tc", n_group=int(cfg.get("n_group", 1)),
                              topk_group=int(cfg.get("topk_group", 1)),
                              routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
                              norm_topk_prob=bool(cfg.get("norm_topk_prob", True)), correction_bias=True)
        check_routing(routing, experts, top_k, ARCH)
    latent = cfg.get("moe_latent_size")
    options = NemotronOptions(
        layer_types=tuple(types), mlp_bias=bool(cfg.get("mlp_bias", False)), experts=experts, top_k=top_k,
        expert_intermediate_size=int(cfg.get("moe_intermediate_size", 7688)),
        shared_intermediate_size=int(cfg.get("moe_shared_expert_intermediate_size", 7688)),
        latent_size=None if latent is None else int(latent), routing=routing)
    spec = make_mamba2(ARCH, Mamba2Spec(
        linear_layers=tuple(t == "linear_attention" for t in types), num_heads=int(cfg.get("mamba_num_heads", 128)),
        head_dim=int(cfg.get("mamba_head_dim", 64)), state_size=int(cfg.get("ssm_state_size", 128)),
        n_groups=int(cfg.get("n_groups", cfg.get("mamba_n_groups", 8))),
        conv_kernel=int(cfg.get("conv_kernel", cfg.get("mamba_d_conv", 4))),
        chunk_size=int(cfg.get("chunk_size", cfg.get("mamba_chunk_size", 128))),
        conv_bias=bool(cfg.get("use_conv_bias", cfg.get("mamba_conv_bias", True))),
        proj_bias=bool(cfg.get("use_bias", False))),  # transformers' mixer reads use_bias, not mamba_proj_bias
        cfg.get("time_step_limit", cfg.get("mamba_dt_limit", (0.0, float("inf")))),
        names=("n_groups", "mamba_num_heads", "conv_kernel", "chunk_size"))
    return dataclasses.replace(out, family_options=options, linear_attn=spec,
                               kv_free_layers=sum(t in ("mlp", "moe") for t in types))


def relu2(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))


class Relu2MLP(nn.Module):
    """down(relu(up(x))^2): NemotronHMLP (the mlp blocks and the MoE's shared expert)."""

    def __init__(self, hidden: int, inter: int, bias: bool):
        super().__init__()
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(relu2(self.up_proj(x)))


class Relu2MoE(nn.Module):
    """NemotronHMoE: routed non-gated experts (through the latent projections when set) plus the shared expert."""

    def __init__(self, hidden: int, opts: NemotronOptions):
        super().__init__()
        self.opts = opts
        width = opts.latent_size or hidden
        E, inter = opts.experts, opts.expert_intermediate_size
        self.router = nn.Parameter(torch.empty(E, hidden))
        self.correction_bias = nn.Parameter(torch.empty(E))
        self.up = nn.Parameter(torch.empty(E, inter, width))
        self.down = nn.Parameter(torch.empty(E, width, inter))
        self.shared = Relu2MLP(hidden, opts.shared_intermediate_size, opts.mlp_bias)
        latent = opts.latent_size is not None
        self.fc1_latent_proj = nn.Linear(hidden, width, bias=opts.mlp_bias) if latent else None
        self.fc2_latent_proj = nn.Linear(width, hidden, bias=opts.mlp_bias) if latent else None
        self.router_float32: Optional[torch.Tensor] = None  # the checkpoint's router in float32 (set at load)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        router = self.router if self.router_float32 is None else self.router_float32
        weights, experts = route_grouped(x, router, self.correction_bias.float(), self.opts.top_k, self.opts.routing)
        h = x if self.fc1_latent_proj is None else self.fc1_latent_proj(x)
        out = grouped_experts(h, weights, experts, self.up, self.down, True, act=relu2)
        out = out if self.fc2_latent_proj is None else self.fc2_latent_proj(out)
        return out + self.shared(x)


class NemotronBlock(nn.Module):
    """norm, one mixer, the residual add (DecoderLayer's contract: the mixer's output is added by the next norm)."""

    def __init__(self, mixer: nn.Module, cfg: ModelConfig, recurrent_or_attention: bool):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mixer = mixer
        self.takes_batch = recurrent_or_attention

    def forward(self, h: torch.Tensor, residual: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        x = self.norm(residual) if h is None else self.norm.add_forward(h, residual)
        return self.mixer(x, fb) if self.takes_batch else self.mixer(x)


class NemotronHForCausalLM(Mamba2Hybrid, LlamaForCausalLM):
    """LlamaForCausalLM's embedding, head and layer loop over Nemotron-H's blocks. One rank: the Mamba2 layers
    refuse tensor parallelism by name (Mamba2Spec.split)."""

    def make_layers(self, cfg: ModelConfig, backend: AttentionBackend, shard: Shard, reduce: Reduce) -> list[nn.Module]:
        spec, opts = cfg.linear_attn.split(shard.size), cfg.family_options
        layers = []
        for i, kind in enumerate(opts.layer_types):
            if kind == "linear_attention":
                mixer = Mamba2Mixer(spec, cfg.hidden_size, cfg.rms_norm_eps, spec.index_of(i))
            elif kind == "full_attention":
                kv_layer = opts.layer_types[:i].count("full_attention")  # its plane in the KV pool
                mixer = HybridAttention(cfg, kv_layer, backend, shard, rope=False)
            elif kind == "mlp":
                mixer = Relu2MLP(cfg.hidden_size, cfg.intermediate_size, opts.mlp_bias)
            else:
                mixer = Relu2MoE(cfg.hidden_size, opts)
            layers.append(NemotronBlock(mixer, cfg, kind in ("linear_attention", "full_attention")))
        return layers

    def load_hf_state_dict(self, tensors: SafetensorsDir) -> None:
        own, done, put = param_setter(self)
        root = "backbone." if "backbone.embeddings.weight" in tensors else "model."
        take = tensors.get
        put("embed_tokens.weight", take(root + "embeddings.weight"))
        put("norm.weight", take(root + "norm_f.weight"))
        if self.lm_head is not None:
            put("lm_head.weight", take("lm_head.weight"))
        for i, layer in enumerate(self.layers):
            src, dst = f"{root}layers.{i}.", f"layers.{i}."
            put(dst + "norm.weight", take(src + "norm.weight"))
            self._load_mixer(layer.mixer, src + "mixer.", dst + "mixer.", tensors, put)
        missing = sorted(set(own) - done)
        if missing:
            raise ValueError(f"parameters not loaded: {missing[:5]}")

    def _load_mixer(self, m: nn.Module, src: str, dst: str, tensors: SafetensorsDir, put: Callable) -> None:
        take, bias = tensors.get, self.cfg.family_options.mlp_bias

        def linears(names: tuple[str, ...], with_bias: bool, prefix: str = "") -> None:
            for p in names:
                for suffix in ("weight", "bias") if with_bias else ("weight",):
                    put(dst + f"{prefix}{p}.{suffix}", take(src + f"{p}.{suffix}"))

        if isinstance(m, Mamba2Mixer):
            spec = self.cfg.linear_attn
            linears(("in_proj", "out_proj"), spec.proj_bias)
            put(dst + "conv_weight", take(src + "conv1d.weight").squeeze(1))  # [C, 1, K] -> [C, K]
            if spec.conv_bias:
                put(dst + "conv_bias", take(src + "conv1d.bias"))
            for p in ("dt_bias", "A_log", "D", "norm.weight"):
                put(dst + p, take(src + p))
        elif isinstance(m, HybridAttention):
            put(dst + "qkv_proj.weight", [take(src + f"{p}_proj.weight") for p in "qkv"])
            put(dst + "o_proj.weight", take(src + "o_proj.weight"))
        elif isinstance(m, Relu2MLP):
            linears(("up_proj", "down_proj"), bias)
        else:
            self._load_moe(m, src, dst, tensors, put)

    def _load_moe(self, m: Relu2MoE, src: str, dst: str, tensors: SafetensorsDir, put: Callable) -> None:
        """Per-expert tensors (experts.{e}.up_proj / down_proj, the hub's) or transformers 5's stacked ones."""
        take, bias = tensors.get, self.cfg.family_options.mlp_bias
        put(dst + "router", take(src + "gate.weight"))
        m.router_float32 = take(src + "gate.weight").float().to(m.router.device)
        put(dst + "correction_bias", take(src + "gate.e_score_correction_bias"))
        if src + "experts.up_proj" in tensors:
            put(dst + "up", take(src + "experts.up_proj"))
            put(dst + "down", take(src + "experts.down_proj"))
        else:
            E = self.cfg.family_options.experts
            put(dst + "up", torch.stack([take(f"{src}experts.{e}.up_proj.weight") for e in range(E)]))
            put(dst + "down", torch.stack([take(f"{src}experts.{e}.down_proj.weight") for e in range(E)]))
        for p in ("up_proj", "down_proj"):
            for suffix in ("weight", "bias") if bias else ("weight",):
                put(dst + f"shared.{p}.{suffix}", take(src + f"shared_experts.{p}.{suffix}"))
        if m.fc1_latent_proj is not None:
            for p in ("fc1_latent_proj", "fc2_latent_proj"):
                for suffix in ("weight", "bias") if bias else ("weight",):
                    put(dst + f"{p}.{suffix}", take(src + f"{p}.{suffix}"))
