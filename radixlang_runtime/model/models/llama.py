"""Llama-family decoder written for the paged KV pool (Llama 2/3, SmolLM2, SmolLM3, Mistral, Qwen2, Qwen3).

Tokens of all requests in a step are flattened into one [T] axis; attention is the only place that
knows about requests, through the backend and the ForwardBatch. q/k/v and gate/up are fused into one
matmul each (weights are concatenated at load time).

Tensor parallel (parallel.py): the modules are built for one rank's Shard (its q/KV heads, its MLP
columns, its vocab rows) and `reduce` sums a row-parallel output over the ranks (None: one rank).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from radixlang_kernels import cpu_ops
from radixlang_runtime.model.layers.attention.base import AttentionBackend
from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.executor.parallel import Reduce, Shard, make_shard
from radixlang_runtime.model.layers.rotary import Rotary
from radixlang_runtime.model.loader.weights import SafetensorsDir, param_setter
from radixlang_runtime.model.layers.mlp import MLP
from radixlang_runtime.model.layers.rms_norm import RMSNorm


def vocab_parallel_lookup(table: nn.Embedding, ids: torch.Tensor, start: int, reduce: Reduce) -> torch.Tensor:
    """ids [T] -> [T, width] from a table holding this rank's rows [start, start + rows) (all of them when
    reduce is None): each rank looks up the ids in its rows (zeros for the others), the all-reduce assembles
    every row."""
    if reduce is None:
        return table(ids)
    local = ids - start
    mine = (local >= 0) & (local < table.num_embeddings)
    return reduce(table(torch.where(mine, local, 0)) * mine.unsqueeze(1).to(table.weight.dtype))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, backend: AttentionBackend, shard: Shard, reduce: Reduce):
        super().__init__()
        self.layer_id = layer_id
        self.h, self.hkv, self.d = shard.q_count, shard.kv_count, cfg.head_dim  # this rank's heads
        self.q_size, self.kv_size = self.h * self.d, self.hkv * self.d
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        # qk norm per head (Qwen3: weights [D]) or over the whole q / k projection (OLMoE: [H D] and [Hkv D],
        # statistics across heads, so one rank cannot hold a part of it)
        self.norm_whole = cfg.qk_norm_whole
        if self.norm_whole and shard.size > 1:
            raise ValueError(f"tp_size {shard.size} is not supported for {cfg.architecture}: its q/k norm spans "
                             "every head of the projection (not implemented across ranks)")
        q_dim, k_dim = (self.q_size, self.kv_size) if self.norm_whole else (self.d, self.d)
        self.q_norm = RMSNorm(q_dim, cfg.rms_norm_eps) if cfg.qk_norm or self.norm_whole else None
        self.k_norm = RMSNorm(k_dim, cfg.rms_norm_eps) if cfg.qk_norm or self.norm_whole else None
        self.clip_qkv = cfg.clip_qkv  # OLMoE: q, k, v clamped to [-clip, clip] after the norm (None: not)
        self.backend = backend
        self.reduce = reduce
        self.use_cpu_kernel = False  # CPU C kernels: rope + K/V store in one pass (cpu_ops.rope_store)
        self.rope = not cfg.layer_rope or cfg.layer_rope[layer_id]  # False: a NoPE layer (no rotary)

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        T = x.shape[0]
        qkv = self.qkv_proj(x)  # [T, (H + 2 Hkv) D]
        if self.norm_whole:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=1)
            qkv = torch.cat([self.q_norm(q.contiguous()), self.k_norm(k.contiguous()), v], dim=1)
        if self.clip_qkv is not None:
            qkv = qkv.clamp(-self.clip_qkv, self.clip_qkv)
        qk = qkv[:, : self.q_size + self.kv_size].view(T, self.h + self.hkv, self.d)  # q and k heads
        v = qkv[:, self.q_size + self.kv_size :].view(T, self.hkv, self.d)
        pool = fb.kv_pool
        head_norm = self.q_norm is not None and not self.norm_whole
        if self.use_cpu_kernel and not head_norm and pool.k_buffers[self.layer_id].dtype == qkv.dtype:
            # Rotary.apply's rounding in place on qkv (qk is a view of it), then k, v into the pool
            cos, sin = fb.rope_cos_sin if self.rope else (None, None)  # a NoPE layer: the store only
            cpu_ops.rope_store(qkv, cos, sin, self.h, self.hkv, self.d, fb.out_loc,
                                   pool.k_buffers[self.layer_id], pool.v_buffers[self.layer_id])
            o = self.backend.attend(qk[:, : self.h], qk[:, self.h :], v, self.layer_id, fb)  # [T, H D]
        else:
            if head_norm:
                qk = torch.cat([self.q_norm(qk[:, : self.h]), self.k_norm(qk[:, self.h :])], dim=1)
            # one pass over q and k: [T, H + Hkv, D]
            qk = Rotary.apply(qk, fb.rope_cos_sin) if self.rope else qk.contiguous()
            o = self.backend.forward(qk[:, : self.h], qk[:, self.h :], v, self.layer_id, fb)  # [T, H D]
        out = self.o_proj(o)  # [T, hidden]: this rank's heads' share
        return out if self.reduce is None else self.reduce(out)


def attend_local_rope(attn: nn.Module, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
    """attn(x, fb) rotating with the sliding layers' own tables (fb.rope_cos_sin_local: Gemma 3's and OLMo 3's
    sliding layers), the step's global tables back after it."""
    glob, fb.rope_cos_sin = fb.rope_cos_sin, fb.rope_cos_sin_local
    try:
        return attn(x, fb)
    finally:
        fb.rope_cos_sin = glob


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, backend: AttentionBackend, shard: Shard, reduce: Reduce,
                 mlp: nn.Module, attn: Optional[nn.Module] = None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # attn: the family's own attention (x [T, hidden], fb) -> [T, hidden] (MLA); None: Attention
        self.self_attn = attn if attn is not None else Attention(cfg, layer_id, backend, shard, reduce)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp  # x [T, hidden] -> [T, hidden], reduced over the ranks: MLP, or model/moe.SparseMoE

    def forward(self, h: torch.Tensor, residual: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """h: the previous block's output (None for the first layer); residual: the stream, updated
        in place (residual += h). Returns this layer's MLP output, to be added by the next norm."""
        x = self.input_layernorm(residual) if h is None else self.input_layernorm.add_forward(h, residual)
        a = self.self_attn(x, fb)
        return self.mlp(self.post_attention_layernorm.add_forward(a, residual))


class LlamaForCausalLM(nn.Module):
    reads_o_proj_bias = False  # a family whose attention has an output bias reads it (load_layer_extras)
    layer_norms = ("input_layernorm", "post_attention_layernorm")  # each layer's norms, checkpoint names

    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, rotary: Rotary,
                 shard: Shard | None = None, reduce: Reduce = None):
        super().__init__()
        self.cfg = cfg
        self.shard = shard = shard or make_shard(cfg.num_attention_heads, cfg.num_key_value_heads,
                                                 cfg.intermediate_size, cfg.vocab_size)
        self.reduce = reduce
        self.embed_tokens = nn.Embedding(shard.vocab_count, cfg.hidden_size)  # this rank's vocab rows
        self.rotary = rotary
        self.layers = nn.ModuleList(self.make_layers(cfg, backend, shard, reduce))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, shard.vocab_count, bias=False)
        self.head: nn.Module | None = None  # set by pack_for_cpu: a packed copy of the output projection
        self.fused_decode = None  # model/fused_decode.FusedDecode, set by the runner where it applies

    def make_layers(self, cfg: ModelConfig, backend: AttentionBackend, shard: Shard, reduce: Reduce) -> list[nn.Module]:
        """The decoder's layers (a family whose layers are not Llama's overrides this: the hybrid models)."""
        return [DecoderLayer(cfg, i, backend, shard, reduce, self.make_mlp(cfg, i, shard, reduce),
                             self.make_attention(cfg, i, shard, reduce)) for i in range(cfg.num_hidden_layers)]

    @staticmethod
    def make_mlp(cfg: ModelConfig, layer_id: int, shard: Shard, reduce: Reduce) -> nn.Module:
        """Layer `layer_id`'s feed-forward block (a family with other blocks overrides this and load_mlp)."""
        return MLP(cfg, shard, reduce)

    @staticmethod
    def make_attention(cfg: ModelConfig, layer_id: int, shard: Shard, reduce: Reduce) -> Optional[nn.Module]:
        """Layer `layer_id`'s attention when the family has its own (None: the paged Attention above)."""
        return None

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] -> [T, hidden]. Vocab-parallel: each rank looks up the ids in its rows (zeros for
        the others) and the all-reduce assembles every row."""
        return vocab_parallel_lookup(self.embed_tokens, ids, self.shard.vocab_start, self.reduce)

    def forward(self, fb: ForwardBatch, logit_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Returns float32 logits [R, V] for the rows `logit_rows` of the flattened tokens
        (all T rows when None). Tensor parallel: [R, vocab_count], this rank's vocab rows."""
        return self.head_logits(self.final_hidden(fb, logit_rows))

    def final_hidden(self, fb: ForwardBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The final norm's output [R, hidden] for the rows `rows` of the flattened tokens (all T when None):
        what the head reads, and what pooling models pool (transformers' last_hidden_state)."""
        residual = self.embed(fb.input_ids)  # [T, hidden], the residual stream
        if fb.image_rows is not None:  # image positions: the vision encoder's features (executor/image_step.py)
            residual[fb.image_rows] = fb.image_embeds.to(residual.dtype)
        fb.rope_cos_sin = self.rotary.cos_sin(fb.positions) if fb.mrope_positions is None else \
            self.rotary.cos_sin_mrope(fb.mrope_positions, self.cfg.mrope_section)
        if self.fused_decode is not None and not fb.has_lora and self.fused_decode.applies(fb):
            h = self.fused_decode.run(residual, fb)  # the same kernels, one C call per layer
        else:
            h = None
            for layer in self.layers:
                h = layer(h, residual, fb)
        if rows is not None:
            h, residual = h[rows], residual[rows]
        return self.norm.add_forward(h, residual)

    def head_logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [R, hidden] (final_hidden) -> float32 logits [R, V]."""
        if self.head is not None:
            return self.head(x).float()  # [R, V]
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(x, w).float()  # [R, V]

    def enable_cpu_ops(self) -> None:
        """CPU C kernels (bf16 / float32, radixlang_kernels.cpu_ops): fused add+RMSNorm, SiLU-and-mul,
        rope + K/V store."""
        for m in self.modules():
            if isinstance(m, (RMSNorm, MLP)) or (isinstance(m, Attention) and self.rotary.full):
                m.use_cpu_kernel = True  # rope_store rotates whole heads: partial rotary stays on Rotary.apply

    def pack_for_cpu(self, tiles: bool = False) -> int:
        """Prepack every projection (and the output head, tied or not) for oneDNN, plus dense tiles for
        decode-sized batches when `tiles`; see packed_linear."""
        from radixlang_runtime.model.layers.packed_linear import PackedLinear, pack_linears

        n = pack_linears(self.layers, tiles)
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        self.head = PackedLinear(w, None, tiles)
        self.lm_head = None  # an untied head now lives only in its packed copy
        return n + 1

    def quantize_int8(self) -> int:
        """Weight-only int8 for every projection and the output head (see quant_linear)."""
        from radixlang_runtime.model.layers.quant_linear import Int8Linear, quantize_linears

        n = quantize_linears(self.layers)
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        self.head = Int8Linear(w, None)
        self.lm_head = None
        return n + 1

    def use_gguf_blocks(self, blocks: dict) -> int:
        """Every linear (and the embedding / output head) whose checkpoint tensors are GGUF blocks in the file
        (HF name -> (rows uint8, type)) runs on them: Q4_1 / Q8_0 linears of one type through gguf_linear's
        tiles, every other type and mix through gguf_block_linear. Returns how many linears; the others keep
        a packed dense weight."""
        from radixlang_kernels.quant_ops import GGUF_BLOCK_FORMATS
        from radixlang_runtime.model.layers.gguf_block_linear import GGUFBlockLinear, GGUFEmbedding
        from radixlang_runtime.model.layers.gguf_linear import GGUFLinear, GGUFTiedEmbedding, fused_blocks
        from radixlang_runtime.model.layers.packed_linear import PackedLinear, dense_tiles_available

        dtype = self.embed_tokens.weight.dtype
        tiles = dense_tiles_available(self.embed_tokens.weight.device, dtype)

        def part(name: str):
            got = blocks.get(name)
            return None if got is None else (torch.from_numpy(got[0]), got[1])

        def on_blocks(w: torch.Tensor, bias, parts: list, tied: bool = False) -> nn.Module:
            fused = fused_blocks(parts)
            if fused is not None and fused[1] in GGUF_BLOCK_FORMATS:
                return GGUFLinear(w, bias, *fused)
            return GGUFBlockLinear(parts, w.shape[1], bias, dtype, tiles=not tied)  # a tied head shares its blocks

        def swap(owner: nn.Module, attr: str, names: list[str]) -> int:
            lin = getattr(owner, attr)
            parts = [part(n) for n in names]
            if any(p is None for p in parts):
                setattr(owner, attr, PackedLinear(lin.weight, lin.bias, tiles))
                return 0
            setattr(owner, attr, on_blocks(lin.weight, lin.bias, parts))
            return 1

        n = 0
        for i, layer in enumerate(self.layers):
            a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            n += swap(layer.self_attn, "qkv_proj", [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"])
            n += swap(layer.self_attn, "o_proj", [a + "o_proj.weight"])
            n += swap(layer.mlp, "gate_up_proj", [m + "gate_proj.weight", m + "up_proj.weight"])
            n += swap(layer.mlp, "down_proj", [m + "down_proj.weight"])
        head_name = "model.embed_tokens.weight" if self.lm_head is None else "lm_head.weight"
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        head = part(head_name)
        tied = self.lm_head is None
        self.head = on_blocks(w, None, [head], tied) if head is not None else PackedLinear(w, None, tiles)
        self.lm_head = None
        embed = part("model.embed_tokens.weight")
        if tied and isinstance(self.head, GGUFLinear) and self.head.tiles is not None and self.reduce is None:
            self.embed_tokens = GGUFTiedEmbedding(self.head, dtype)  # one copy: the head's int8 tiles
        elif embed is not None and self.reduce is None:  # the lookup dequantizes its tokens' rows
            self.embed_tokens = GGUFEmbedding(*embed, self.cfg.hidden_size, dtype)
        return n + (head is not None)

    # --- weights ---
    def load_hf_state_dict(self, tensors: SafetensorsDir) -> None:
        """Load HF-named tensors (this rank's slices only); fuses q/k/v and gate/up. Every parameter
        must be covered."""
        cfg, sh, d = self.cfg, self.shard, self.cfg.head_dim
        q_rows = (sh.q_start * d, (sh.q_start + sh.q_count) * d)
        kv_rows = (sh.kv_start * d, (sh.kv_start + sh.kv_count) * d)
        vocab = (sh.vocab_start, sh.vocab_start + sh.vocab_count)
        own, done, put = param_setter(self)

        take = tensors.get

        put("embed_tokens.weight", take("model.embed_tokens.weight", rows=vocab))
        put("norm.weight", take("model.norm.weight"))
        if self.lm_head is not None:
            put("lm_head.weight", take("lm_head.weight", rows=vocab))
        for i in range(cfg.num_hidden_layers):
            src, dst = f"model.layers.{i}.", f"layers.{i}."
            a = src + "self_attn."
            put(dst + "self_attn.qkv_proj.weight", [
                take(a + "q_proj.weight", rows=q_rows), take(a + "k_proj.weight", rows=kv_rows),
                take(a + "v_proj.weight", rows=kv_rows)])
            if cfg.attention_bias:
                put(dst + "self_attn.qkv_proj.bias", [
                    take(a + "q_proj.bias", rows=q_rows), take(a + "k_proj.bias", rows=kv_rows),
                    take(a + "v_proj.bias", rows=kv_rows)])
            put(dst + "self_attn.o_proj.weight", take(a + "o_proj.weight", cols=q_rows))
            if not self.reads_o_proj_bias and a + "o_proj.bias" in tensors:  # Llama's attention_bias true
                raise ValueError(f"{a}o_proj.bias: an attention output bias is not supported ({cfg.architecture} "
                                 "here biases q / k / v only)")
            if cfg.qk_norm or cfg.qk_norm_whole:  # whole: one rank only (Attention refuses tp_size > 1)
                put(dst + "self_attn.q_norm.weight", take(a + "q_norm.weight"))
                put(dst + "self_attn.k_norm.weight", take(a + "k_norm.weight"))
            self.load_mlp(i, tensors, put)
            for norm in self.layer_norms:
                put(f"{dst}{norm}.weight", take(f"{src}{norm}.weight"))
            self.load_layer_extras(i, tensors, put)
        missing = sorted(set(own) - done)
        if missing:
            raise ValueError(f"parameters not loaded: {missing[:5]}")

    def load_layer_extras(self, i: int, tensors: SafetensorsDir, put: Callable[[str, torch.Tensor], None]) -> None:
        """Layer i's parameters beyond Llama's (a family with more, e.g. Gemma's extra norms, overrides this)."""

    def load_mlp(self, i: int, tensors: SafetensorsDir, put: Callable[[str, torch.Tensor], None]) -> None:
        """Layer i's dense MLP: gate and up fused, this rank's intermediate columns."""
        sh, m = self.shard, f"model.layers.{i}.mlp."
        inter = (sh.inter_start, sh.inter_start + sh.inter_count)
        put(f"layers.{i}.mlp.gate_up_proj.weight", [tensors.get(m + "gate_proj.weight", rows=inter),
                                                     tensors.get(m + "up_proj.weight", rows=inter)])
        put(f"layers.{i}.mlp.down_proj.weight", tensors.get(m + "down_proj.weight", cols=inter))


__all__ = ["MLP", "Attention", "DecoderLayer", "LlamaForCausalLM", "RMSNorm", "Reduce", "param_setter",
           "vocab_parallel_lookup"]
