"""Gemma 4 text (Gemma4ForCausalLM; Gemma4ForConditionalGeneration served as its text model), as transformers'
Gemma4TextModel computes it (the config is models/gemma4_config.py's):

- RMSNorm times w (not Gemma 2/3's 1 + w), in float32; pre + post norms around attention and around the MLP;
- GeGLU MLP (gelu_pytorch_tanh), twice as wide on the KV-shared layers with use_double_wide_mlp;
- attention: q, k per-head RMSNorm before RoPE, v RMSNorm without weight, scale 1; head_dim and KV heads per
  layer (per_layer_config), each layer's K/V stored at its own shape (gemma4_config's docstring); attention_k_eq_v: a
  full layer's V is its key projection; a sliding / global layer pattern with a rope per layer type (the global
  layers' "proportional" rope);
- KV-shared layers: no K/V projections; they attend over their source layer's pool plane (its new tokens'
  K/V handed over within the step, as transformers' shared_kv_states);
- per-layer input embeddings (PLE): a second embedding table [vocab, layers * ple_dim] scaled by sqrt(ple_dim),
  plus a projection of the main embedding scaled by hidden ** -0.5 and normed, summed and scaled by 2 ** -0.5;
  each layer gates its slice with gelu_tanh(gate(h)), projects it back to hidden, norms it and adds it;
- enable_moe_block: a mixture of experts beside the dense MLP (models/gemma4_moe.py), each output normed, summed;
- each layer's output scaled by its layer_scalar; embeddings times sqrt(hidden_size) (in the weights' dtype);
  final logit soft-capping.
Tensor parallelism: heads split in whole GQA groups over the widest KV heads, as every family's
(executor/parallel.py); a layer with fewer KV heads computes and stores the ones its rank's query heads read
(kv_share: a single KV head on every rank; repeated per wide head only where a rank's share cuts two heads'
groups unequally); a KV-shared layer reads its source's plane on the same rank. o_proj, the dense MLP's down
projection (per-layer widths split alike) and each expert's intermediate columns are row-parallel (one
all-reduce each); the embedding and the head are vocab-parallel, and so is the per-layer input embedding
table (each rank its rows, one all-reduce of the step's [T, layers x ple_dim] lookups); its projection from the
main embedding is replicated.
Not implemented, refused by name: bidirectional attention, GGUF blocks, LoRA adapters.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.executor.parallel import Shard, make_shard, split_even
from radixlang_runtime.model.layers.attention.base import AttentionBackend
from radixlang_runtime.model.layers.rotary import Rotary
from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.model.loader.weights import SafetensorsDir
from radixlang_runtime.model.models.gemma2 import GeluMLP
from radixlang_runtime.model.models.gemma4_config import MULTIMODAL, Gemma4Layers, kv_share, rank_kv_heads
from radixlang_runtime.model.models.gemma4_moe import Gemma4MoE
from radixlang_runtime.model.models.llama import (LlamaForCausalLM, Reduce, RMSNorm, param_setter,
                                                  vocab_parallel_lookup)

__all__ = ["Gemma4ForCausalLM"]


class Gemma4Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, backend: AttentionBackend, shard: Shard, reduce: Reduce):
        super().__init__()
        lay: Gemma4Layers = cfg.family_options
        self.plane = lay.kv_plane[layer_id]  # the pool plane (and the backend's layer) of this layer's K/V
        self.owns_kv, self.k_eq_v = lay.owns_kv(layer_id), lay.k_eq_v[layer_id]
        self.q_start, self.h, self.d = shard.q_start, shard.q_count, lay.head_dims[layer_id]  # this rank's q heads
        self.kv_start, self.fills = kv_share(cfg.num_key_value_heads, lay.kv_heads[layer_id], shard.kv_start,
                                             shard.kv_count)
        self.hkv = len(self.fills)  # this rank's KV heads of the layer
        # the pool's entry for them (gemma4_config.rank_kv_heads): hkv heads, or kv_count with heads repeated
        self.pool_heads = rank_kv_heads(cfg.num_key_value_heads, lay.kv_heads[layer_id], shard.kv_start,
                                        shard.kv_count)
        self.reduce = reduce
        kv_out = 0 if not self.owns_kv else self.hkv * self.d * (1 if self.k_eq_v else 2)
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.h * self.d + kv_out, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps) if self.owns_kv else None
        self.eps = cfg.rms_norm_eps
        self.local = lay.sliding[layer_id]
        self.backend = backend

    def _kv_entry(self, x: torch.Tensor) -> torch.Tensor:
        """[T, hkv, d] -> the pool's entry [T, pool_heads, d]: the heads themselves, or (a rank whose share cuts
        two heads' groups unequally) each repeated for the rank's wide heads it serves."""
        if self.pool_heads == self.hkv:
            return x
        return torch.cat([x[:, i:i + 1].expand(-1, n, -1) for i, n in enumerate(self.fills)], dim=1).contiguous()

    def forward(self, x: torch.Tensor, fb: ForwardBatch, cos_sin, shared: dict) -> torch.Tensor:
        T = x.shape[0]
        qkv = self.qkv_proj(x)
        q = Rotary.apply(self.q_norm(qkv[:, : self.h * self.d].view(T, self.h, self.d)), cos_sin)
        if self.owns_kv:
            k_raw = qkv[:, self.h * self.d: (self.h + self.hkv) * self.d].view(T, self.hkv, self.d)
            v_raw = k_raw if self.k_eq_v else qkv[:, (self.h + self.hkv) * self.d:].view(T, self.hkv, self.d)
            k = self._kv_entry(Rotary.apply(self.k_norm(k_raw), cos_sin))
            v = self._kv_entry(F.rms_norm(v_raw, (self.d,), None, self.eps))
            shared[self.plane] = k, v  # the KV-shared layers' new tokens (the pool has them too)
            o = self.backend.forward(q, k, v, self.plane, fb)
        else:
            k, v = shared[self.plane]
            o = self.backend.attend(q, k, v, self.plane, fb)
        o = self.o_proj(o)  # [T, h * d]
        return o if self.reduce is None else self.reduce(o)


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, backend: AttentionBackend, shard: Shard, reduce: Reduce):
        super().__init__()
        lay: Gemma4Layers = cfg.family_options
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Gemma4Attention(cfg, layer_id, backend, shard, reduce)
        inter_start, inter = split_even(lay.intermediate[layer_id], shard.size, shard.rank)  # this rank's columns
        self.mlp = GeluMLP(cfg, dataclasses.replace(shard, inter_start=inter_start, inter_count=inter), reduce)
        self.mlp_start = inter_start
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, RMSNorm(hidden, eps))
        self.layer_scalar = nn.Parameter(torch.ones(1))
        self.moe = Gemma4MoE(hidden, *lay.moe, eps, shard, reduce) if lay.moe else None
        if self.moe is not None:
            for name in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"):
                setattr(self, name, RMSNorm(hidden, eps))
        self.ple = lay.ple_dim > 0
        if self.ple:
            self.per_layer_input_gate = nn.Linear(hidden, lay.ple_dim, bias=False)
            self.per_layer_projection = nn.Linear(lay.ple_dim, hidden, bias=False)
            self.post_per_layer_input_norm = RMSNorm(hidden, eps)

    def forward(self, h: torch.Tensor, fb: ForwardBatch, cos_sin, shared: dict,
                ple: Optional[torch.Tensor]) -> torch.Tensor:
        """h: the residual stream [T, hidden] -> the next one; ple: this layer's per-layer input [T, ple_dim]."""
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), fb, cos_sin, shared))
        m = self.mlp(self.pre_feedforward_layernorm(h))
        if self.moe is not None:  # the dense MLP and the experts side by side, each normed, summed
            m = self.post_feedforward_layernorm_1(m) + self.post_feedforward_layernorm_2(
                self.moe(h, self.pre_feedforward_layernorm_2(h)))
        h = h + self.post_feedforward_layernorm(m)
        if self.ple:
            g = F.gelu(self.per_layer_input_gate(h), approximate="tanh") * ple
            h = h + self.post_per_layer_input_norm(self.per_layer_projection(g))
        return h * self.layer_scalar


class Gemma4ForCausalLM(LlamaForCausalLM):
    # the fused projection holds q only (KV-shared layers) or q and k (attention_k_eq_v): no q / k / v parts
    lora_refusal = "enable_lora is not supported for Gemma 4 (its layers' q / k / v projections differ in shape)"

    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, rotary: Rotary, shard: Optional[Shard] = None,
                 reduce: Reduce = None):
        nn.Module.__init__(self)
        self.cfg = cfg
        self.shard = shard = shard or make_shard(cfg.num_attention_heads, cfg.num_key_value_heads,
                                                 cfg.intermediate_size, cfg.vocab_size)
        self.reduce = reduce
        lay: Gemma4Layers = cfg.family_options
        backend.set_layer_shapes(lay.kv_shapes(cfg.num_key_value_heads, shard.kv_start, shard.kv_count))
        self.embed_tokens = nn.Embedding(shard.vocab_count, cfg.hidden_size)  # this rank's vocab rows
        self.rotary = rotary  # the full-attention layers' tables; the sliding layers': rotary_local
        self.rotary_local = Rotary(cfg.rope_local, rotary.cos.shape[0], rotary.cos.device, rotary.cos.dtype)
        self.layers = nn.ModuleList(Gemma4DecoderLayer(cfg, i, backend, shard, reduce)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, shard.vocab_count, bias=False)
        self.head: nn.Module | None = None
        self.fused_decode = None  # decode_layer.c has no Gemma 4 layer
        self.ple_dim = lay.ple_dim
        if self.ple_dim:
            width = cfg.num_hidden_layers * lay.ple_dim
            rows = -(-lay.ple_vocab // shard.size)  # this rank's rows of the per-layer table
            self.ple_rows = (shard.rank * rows, min(lay.ple_vocab, (shard.rank + 1) * rows))
            if self.ple_rows[1] <= self.ple_rows[0]:
                raise ValueError(f"tp_size {shard.size} leaves rank {shard.rank} no rows of the per-layer input "
                                 f"embeddings (vocab_size_per_layer_input {lay.ple_vocab})")
            self.embed_tokens_per_layer = nn.Embedding(self.ple_rows[1] - self.ple_rows[0], width)
            self.per_layer_model_projection = nn.Linear(cfg.hidden_size, width, bias=False)
            self.per_layer_projection_norm = RMSNorm(lay.ple_dim, cfg.rms_norm_eps)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = super().embed(ids)  # [T, hidden] (vocab-parallel); transformers rounds sqrt(hidden) to the dtype first
        return x * torch.tensor(math.sqrt(self.cfg.hidden_size), dtype=x.dtype)

    def per_layer_inputs(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """transformers' get_per_layer_inputs + project_per_layer_inputs: [T, layers, ple_dim]."""
        T, n = ids.shape[0], self.cfg.num_hidden_layers
        tok = vocab_parallel_lookup(self.embed_tokens_per_layer, ids, self.ple_rows[0], self.reduce)
        tok = (tok * torch.tensor(self.ple_dim ** 0.5, dtype=tok.dtype)).view(T, n, self.ple_dim)
        proj = (self.per_layer_model_projection(x) * self.cfg.hidden_size ** -0.5).view(T, n, self.ple_dim)
        return (self.per_layer_projection_norm(proj) + tok) * 2.0 ** -0.5

    def final_hidden(self, fb: ForwardBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed(fb.input_ids)  # [T, hidden]
        ple = self.per_layer_inputs(fb.input_ids, h) if self.ple_dim else None
        glob, local = self.rotary.cos_sin(fb.positions), self.rotary_local.cos_sin(fb.positions)
        fb.rope_cos_sin = glob
        shared: dict = {}  # pool plane -> the step's new K/V of that layer (read by the KV-shared layers)
        for i, layer in enumerate(self.layers):
            h = layer(h, fb, local if layer.self_attn.local else glob, shared, None if ple is None else ple[:, i])
        if rows is not None:
            h = h[rows]
        return self.norm(h)

    def forward(self, fb: ForwardBatch, logit_rows: torch.Tensor | None = None) -> torch.Tensor:
        logits = super().forward(fb, logit_rows)  # float32 [R, V]
        cap = self.cfg.final_logit_softcapping
        return logits if not cap else torch.tanh(logits / cap) * cap

    def use_gguf_blocks(self, blocks: dict) -> int:
        raise ValueError(f"--quantization gguf is not implemented for {self.cfg.architecture}")

    def load_hf_state_dict(self, tensors: SafetensorsDir) -> None:
        cfg = self.cfg
        src = "model.language_model." if cfg.architecture == MULTIMODAL else "model."
        own, done, put = param_setter(self)
        take, sh = tensors.get, self.shard
        vocab = (sh.vocab_start, sh.vocab_start + sh.vocab_count)
        put("embed_tokens.weight", take(src + "embed_tokens.weight", rows=vocab))
        for name in ("norm.weight",) + (
                ("per_layer_model_projection.weight", "per_layer_projection_norm.weight") if self.ple_dim else ()):
            put(name, take(src + name))
        if self.ple_dim:
            put("embed_tokens_per_layer.weight", take(src + "embed_tokens_per_layer.weight", rows=self.ple_rows))
        if self.lm_head is not None:
            put("lm_head.weight", take("lm_head.weight", rows=vocab))
        for i, layer in enumerate(self.layers):
            s, d = f"{src}layers.{i}.", f"layers.{i}."
            a, attn = s + "self_attn.", layer.self_attn
            q_rows = (attn.q_start * attn.d, (attn.q_start + attn.h) * attn.d)
            kv_rows = (attn.kv_start * attn.d, (attn.kv_start + attn.hkv) * attn.d)
            parts = [("q_proj", q_rows)] + ([("k_proj", kv_rows)] + ([] if attn.k_eq_v else [("v_proj", kv_rows)])
                                            if attn.owns_kv else [])
            put(d + "self_attn.qkv_proj.weight", torch.cat([take(f"{a}{p}.weight", rows=r) for p, r in parts]))
            put(d + "self_attn.o_proj.weight", take(a + "o_proj.weight", cols=q_rows))
            put(d + "self_attn.q_norm.weight", take(a + "q_norm.weight"))
            if attn.owns_kv:
                put(d + "self_attn.k_norm.weight", take(a + "k_norm.weight"))
            m, inter = s + "mlp.", (layer.mlp_start, layer.mlp_start + layer.mlp.inter)
            put(d + "mlp.gate_up_proj.weight", torch.cat([take(m + "gate_proj.weight", rows=inter),
                                                          take(m + "up_proj.weight", rows=inter)]))
            put(d + "mlp.down_proj.weight", take(m + "down_proj.weight", cols=inter))
            names = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"] + (
                ["per_layer_input_gate", "per_layer_projection", "post_per_layer_input_norm"] if layer.ple else []) + (
                ["post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"]
                if layer.moe is not None else [])
            if layer.moe is not None:
                layer.moe.load(s, take, put, d + "moe.")
            for name in names:
                put(f"{d}{name}.weight", take(f"{s}{name}.weight"))
            put(d + "layer_scalar", take(s + "layer_scalar").reshape(1))
        missing = sorted(set(own) - done)
        if missing:
            raise ValueError(f"parameters not loaded: {missing[:5]}")
