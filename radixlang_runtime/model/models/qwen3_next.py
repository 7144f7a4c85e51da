"""Qwen3-Next (Qwen3NextForCausalLM) and Qwen3.5 text (Qwen3_5ForCausalLM): hybrid decoders whose layers are
Gated DeltaNet (model/layers/gated_deltanet.py: a recurrent state in the state pool, no KV) or gated full attention
(the paged KV pool), as config.json's layer_types (or full_attention_interval) says.

Full attention: q_proj yields per head the query and an output gate (sigmoid(gate) scales the attention output
before o_proj), q/k RMSNorm per head, partial rotary (partial_rotary_factor, 0.25 by default), o_proj with
attention_bias. Norms are zero-centred (weights read as 1 + w, in float32) except the DeltaNet's gated norm.
Qwen3-Next's feed-forward is the MoE of model/layers/moe.py with a gated shared expert (decoder_sparse_step,
mlp_only_layers); Qwen3.5's is dense. Qwen3.5's rope fields mrope_section / mrope_interleaved only matter for
image and video positions: a text prompt gives the three axes the same position, where multimodal rope is the
plain one, so they are accepted; the vision model (Qwen3_5ForConditionalGeneration) is refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn

from radixlang_kernels import gdn_ops
from radixlang_runtime.model.layers.hybrid_layer import HybridDecoderLayer
from radixlang_runtime.model.layers.attention.base import AttentionBackend
from radixlang_runtime.model.loader.config import ModelConfig, base_config
from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.layers.gated_deltanet import GatedDeltaNet
from radixlang_runtime.model.layers.linear_attn_spec import parse_linear_attn
from radixlang_runtime.model.models.llama import MLP, Reduce, RMSNorm, param_setter
from radixlang_runtime.model.layers.moe import SparseMoE
from radixlang_runtime.model.models.moe_decoder import MoEForCausalLM
from radixlang_runtime.model.layers.moe_spec import parse_moe, qwen_sparse_layers
from radixlang_runtime.model.executor.parallel import Shard
from radixlang_runtime.model.layers.rotary import Rotary
from radixlang_runtime.model.loader.weights import SafetensorsDir

_DEFAULTS = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 48, "num_attention_heads": 16,
             "num_key_value_heads": 2, "head_dim": 256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6}


def _hybrid_common(cfg: dict, arch: str) -> ModelConfig:
    cfg = {**_DEFAULTS, **cfg}
    rope = dict(cfg.get("rope_parameters") or {})
    if arch == "Qwen3_5ForCausalLM":  # text positions: the three axes agree (module docstring)
        rope.pop("mrope_section", None)
        rope.pop("mrope_interleaved", None)
    if "partial_rotary_factor" not in rope and "partial_rotary_factor" not in cfg:
        rope["partial_rotary_factor"] = 0.25  # the config classes' default
    cfg = {**cfg, "rope_parameters": rope or None}
    out = base_config(cfg, arch, attention_bias=bool(cfg.get("attention_bias", False)), qk_norm=True,
                      sliding_window=None, partial_rotary=True)
    return dataclasses.replace(out, linear_attn=parse_linear_attn(cfg, arch))


def parse_qwen3_next(cfg: dict) -> ModelConfig:
    arch = "Qwen3NextForCausalLM"
    out = _hybrid_common(cfg, arch)
    experts = int(cfg.get("num_experts", 512))
    moe = parse_moe(cfg, arch, experts_key="num_experts", default_experts=512, default_top_k=10,
                    inter_key="moe_intermediate_size", default_inter=512,
                    norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
                    shared_intermediate_size=int(cfg.get("shared_expert_intermediate_size", 512)),
                    sparse_layers=qwen_sparse_layers({**cfg, "num_hidden_layers": out.num_hidden_layers}, experts))
    return dataclasses.replace(out, moe=moe)


def parse_qwen3_5(cfg: dict) -> ModelConfig:
    arch = "Qwen3_5ForCausalLM"
    if "text_config" in cfg:
        raise ValueError("a Qwen3.5 config with text_config (Qwen3_5ForConditionalGeneration: the vision-language "
                         "model) is not supported; the text model Qwen3_5ForCausalLM is")
    return _hybrid_common({"intermediate_size": 12288, "num_hidden_layers": 32, "num_key_value_heads": 4, **cfg}, arch)


def refuse_conditional_generation(cfg: dict) -> ModelConfig:
    raise ValueError("Qwen3_5ForConditionalGeneration (the Qwen3.5 vision-language model) is not supported; "
                     "the text model Qwen3_5ForCausalLM is")


class GatedAttention(nn.Module):
    """Full attention with an output gate: qkv_proj rows are per head [query D, gate D], then k, then v."""

    def __init__(self, cfg: ModelConfig, kv_layer: int, backend: AttentionBackend, shard: Shard, reduce: Reduce):
        super().__init__()
        self.reduce = reduce  # tensor parallel: this rank's heads, o_proj row-parallel
        self.kv_layer = kv_layer  # this layer's index in the KV pool (full-attention layers only)
        self.h, self.hkv, self.d = shard.q_count, shard.kv_count, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (2 * self.h + 2 * self.hkv) * self.d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=cfg.attention_bias and shard.rank == 0)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.backend = backend
        self.deterministic = False  # --enable-deterministic-inference: the norms and the gate one row at a time

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        T, h, hkv, d = x.shape[0], self.h, self.hkv, self.d
        qkv = self.qkv_proj(x)
        qg = qkv[:, : 2 * h * d].view(T, h, 2 * d)
        q, gate = qg[..., :d], qg[..., d:].reshape(T, h * d)
        k = qkv[:, 2 * h * d: (2 * h + hkv) * d].view(T, hkv, d)
        v = qkv[:, (2 * h + hkv) * d:].view(T, hkv, d)
        if self.deterministic:  # the C norms one head's row at a time (contiguous rows: else torch's)
            qk = torch.cat([self.q_norm(q.reshape(T * h, d).contiguous()).view(T, h, d),
                            self.k_norm(k.reshape(T * hkv, d).contiguous()).view(T, hkv, d)], dim=1)
        else:
            qk = torch.cat([self.q_norm(q.contiguous()), self.k_norm(k.contiguous())], dim=1)
        qk = Rotary.apply(qk, fb.rope_cos_sin)
        o = self.backend.forward(qk[:, :h], qk[:, h:], v.contiguous(), self.kv_layer, fb)  # [T, H D]
        gated = gdn_ops.sigmoid_mul(o, gate).to(o.dtype) if self.deterministic else o * torch.sigmoid(gate)
        out = self.o_proj(gated)
        return out if self.reduce is None else self.reduce(out)


class HybridForCausalLM(MoEForCausalLM):
    """Both families (Qwen3.5: cfg.moe None, dense MLPs). LlamaForCausalLM's embedding, head and layer loop.
    Tensor parallel: full attention and the feed-forward split as Llama's, each Gated DeltaNet its heads
    (GatedDeltaNet), every mixer's and feed-forward's output summed over the ranks by `reduce`."""

    def make_layers(self, cfg: ModelConfig, backend: AttentionBackend, shard: Shard, reduce: Reduce) -> list[nn.Module]:
        spec = cfg.linear_attn
        part = spec.split(shard.size)  # this rank's linear-attention heads
        layers = []
        for i, linear in enumerate(spec.linear_layers):
            mixer = (GatedDeltaNet(part, cfg.hidden_size, cfg.rms_norm_eps, spec.index_of(i), reduce) if linear
                     else GatedAttention(cfg, i - spec.index_of(i), backend, shard, reduce))
            layers.append(HybridDecoderLayer(mixer, self.make_mlp(cfg, i, shard, reduce), cfg))
        return layers

    def enable_cpu_ops(self) -> None:
        """The CPU C kernels: the norms and activations (LlamaForCausalLM's), and Gated DeltaNet's decode."""
        super().enable_cpu_ops()
        for layer in self.layers:
            if isinstance(layer.mixer, GatedDeltaNet):
                layer.mixer.use_cpu_kernel = True

    def use_triton_kernels(self) -> None:
        """Every Gated DeltaNet through the Triton kernels (--attention-backend triton: radixlang_kernels/
        gated_deltanet.py), decode and prefill."""
        for layer in self.layers:
            if isinstance(layer.mixer, GatedDeltaNet):
                layer.mixer.use_cpu_kernel, layer.mixer.use_triton = False, True

    def enable_deterministic(self) -> None:
        """--enable-deterministic-inference (model/executor/deterministic.py): every Gated DeltaNet through the C
        kernels with each token's row alone and prefill's arithmetic equal to decode's; the gated attention's
        norms and output gate one row at a time. ValueError when the DeltaNet kernels are not in use."""
        for layer in self.layers:
            mixer = layer.mixer
            if isinstance(mixer, GatedDeltaNet) and not mixer.use_cpu_kernel:
                raise ValueError("the Gated DeltaNet C kernels (gated_deltanet.c) are not in use")
            mixer.deterministic = True

    @staticmethod
    def make_mlp(cfg: ModelConfig, layer_id: int, shard: Shard, reduce: Reduce) -> nn.Module:
        if cfg.moe is not None and cfg.moe.sparse_layers[layer_id]:
            return SparseMoE(cfg, shard, reduce)
        return MLP(cfg, shard, reduce)

    def use_gguf_blocks(self, blocks: dict) -> int:
        raise ValueError(f"--quantization gguf is not supported for {self.cfg.architecture} (hybrid linear attention)")

    def load_hf_state_dict(self, tensors: SafetensorsDir) -> None:
        own, done, put = param_setter(self)

        def norm(name: str) -> torch.Tensor:  # zero-centred: 1 + w in float32
            return 1.0 + tensors.get(name).float()

        vocab = (self.shard.vocab_start, self.shard.vocab_start + self.shard.vocab_count)  # this rank's rows
        put("embed_tokens.weight", tensors.get("model.embed_tokens.weight", rows=vocab))
        put("norm.weight", norm("model.norm.weight"))
        if self.lm_head is not None:
            put("lm_head.weight", tensors.get("lm_head.weight", rows=vocab))
        for i, layer in enumerate(self.layers):
            src, dst = f"model.layers.{i}.", f"layers.{i}."
            put(dst + "input_layernorm.weight", norm(src + "input_layernorm.weight"))
            put(dst + "post_attention_layernorm.weight", norm(src + "post_attention_layernorm.weight"))
            if isinstance(layer.mixer, GatedDeltaNet):
                self._load_deltanet(layer.mixer, src + "linear_attn.", dst + "mixer.", tensors, put)
            else:
                self._load_attention(src + "self_attn.", dst + "mixer.", tensors, put, norm)
            self.load_mlp(i, tensors, put)
            self.load_layer_extras(i, tensors, put)
        missing = sorted(set(own) - done)
        if missing:
            raise ValueError(f"parameters not loaded: {missing[:5]}")

    def _load_attention(self, src: str, dst: str, tensors: SafetensorsDir, put: Callable,
                        norm: Callable[[str], torch.Tensor]) -> None:
        """This rank's heads: q_proj's rows per head [query D, gate D], k/v rows, o_proj's columns."""
        sh, d = self.shard, self.cfg.head_dim
        q_rows = (2 * sh.q_start * d, 2 * (sh.q_start + sh.q_count) * d)
        kv_rows = (sh.kv_start * d, (sh.kv_start + sh.kv_count) * d)
        o_cols = (sh.q_start * d, (sh.q_start + sh.q_count) * d)
        for suffix in ("weight", "bias") if self.cfg.attention_bias else ("weight",):
            put(dst + f"qkv_proj.{suffix}", torch.cat([tensors.get(src + f"q_proj.{suffix}", rows=q_rows),
                                                       tensors.get(src + f"k_proj.{suffix}", rows=kv_rows),
                                                       tensors.get(src + f"v_proj.{suffix}", rows=kv_rows)]))
        if self.cfg.attention_bias and sh.rank == 0:  # added once, before the reduce
            put(dst + "o_proj.bias", tensors.get(src + "o_proj.bias"))
        put(dst + "o_proj.weight", tensors.get(src + "o_proj.weight", cols=o_cols))
        put(dst + "q_norm.weight", norm(src + "q_norm.weight"))
        put(dst + "k_norm.weight", norm(src + "k_norm.weight"))

    def _load_deltanet(self, m: GatedDeltaNet, src: str, dst: str, tensors: SafetensorsDir, put: Callable) -> None:
        """The layer's rows in the flat order (q/k/v channels, z, b, a), then this rank's heads of them."""
        spec, size, rank = self.cfg.linear_attn, self.shard.size, self.shard.rank
        if src + "in_proj_qkv.weight" in tensors:  # Qwen3.5: four projections
            qkv, z, b, a = (tensors.get(src + f"in_proj_{p}.weight") for p in ("qkv", "z", "b", "a"))
        else:  # Qwen3-Next: per key head [q Dk, k Dk, v r Dv, z r Dv] and [b r, a r] (r = Hv / Hk)
            hk, r, dk, dv = spec.num_k_heads, spec.num_v_heads // spec.num_k_heads, spec.k_head_dim, spec.v_head_dim
            qkvz = tensors.get(src + "in_proj_qkvz.weight")
            q, k, v, z = qkvz.view(hk, -1, qkvz.shape[-1]).split([dk, dk, r * dv, r * dv], dim=1)
            ba = tensors.get(src + "in_proj_ba.weight")
            b, a = ba.view(hk, 2 * r, ba.shape[-1]).split([r, r], dim=1)
            qkv = torch.cat([x.reshape(-1, x.shape[-1]) for x in (q, k, v)])
            z, b, a = (x.reshape(-1, x.shape[-1]) for x in (z, b, a))
        channels = torch.tensor([c for part in spec.rank_channels(size, rank) for c in part])
        heads = slice(rank * m.hv, (rank + 1) * m.hv)  # this rank's value heads
        values = slice(rank * m.value_dim, (rank + 1) * m.value_dim)
        put(dst + "in_proj.weight", torch.cat([qkv[channels], z[values], b[heads], a[heads]]))
        put(dst + "conv_weight", tensors.get(src + "conv1d.weight").reshape(spec.conv_dim, -1)[channels])
        put(dst + "dt_bias", tensors.get(src + "dt_bias")[heads])
        put(dst + "A_log", tensors.get(src + "A_log")[heads])
        put(dst + "norm.weight", tensors.get(src + "norm.weight"))
        put(dst + "out_proj.weight", tensors.get(src + "out_proj.weight")[:, values])
