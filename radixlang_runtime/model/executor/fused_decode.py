"""Decode-sized steps through the kernels' decode_layer (cpu_ops.decode_layers): one C call per decoder layer.

A one-stream decode step runs ~15 torch ops and kernel calls per layer; once the weights stream at the
memory's rate (gemv_dense.c) their dispatch is a large share of the step. FusedDecode describes each
layer's weights to decode_layer.c once (pointers into the modules' own tensors: nothing is copied) and
runs a step's layers as 30 calls.

Invariant: a step runs here only when the module path would run exactly the same kernels: CPU, bf16 /
float32, one rank, no q/k norm or clip_qkv, dense MLPs (no MoE block), every linear a decode kernel
(PackedLinear with dense tiles, GGUFLinear, GGUFBlockLinear, Int8Linear), at most `max_batch` rows
(DENSE_MAX_M, MAX_ANY_M where every linear's tiles take any M, or the GGUF linears' fused_max_m), and the
attention backend's C decode
(with or without cascade groups; not the deterministic row mode; sliding windows as the backend applies
them, one window value; no attention sinks). NoPE layers (ModelConfig.layer_rope) skip the rotary there as in
the modules.
Then the result is bit-identical to the module path (tests/test_fused_decode.py); otherwise `applies` is
False and the modules run.
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional

import torch
from torch import nn

from radixlang_kernels import cpu_ops, quant_ops
from radixlang_runtime.model.layers.attention.torch_backend import CDecodeMeta
from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.layers.gguf_block_linear import GGUFBlockLinear
from radixlang_runtime.model.layers.gguf_linear import GGUFLinear
from radixlang_runtime.model.models.llama import MLP, DecoderLayer
from radixlang_runtime.model.layers.packed_linear import PackedLinear
from radixlang_runtime.model.layers.quant_linear import Int8Linear


# decode_layer.c's records (radixlang_kernels/csrc/cpu/kernels.h): DecodeLinear kind 0 dense tiles, 1 GGUF
# blocks, 2 int8 rows + scale, 3 GGUF tiles with int8 activations (gemv_q8.c), 4 int8 tiles + scale with
# int8 activations, 5 parts side by side, 6 / 7 GGUF blocks of any type with int8 activations / exact sums
DecodeLinear, DecodeLayerWeights, DecodeStep = cpu_ops.DecodeLinear, cpu_ops.DecodeLayerWeights, cpu_ops.DecodeStep
_ptr = cpu_ops.opt_ptr


def describe_linear(lin: nn.Module) -> Optional[DecodeLinear]:
    """The kernel a decode-sized batch of `lin` runs, as decode_layer.c's descriptor; None when it has none."""
    if isinstance(lin, PackedLinear) and lin.tiles is not None:
        return DecodeLinear(0, 0, lin.out_features, lin.in_features, lin.tiles.data_ptr(), None, _ptr(lin.bias))
    if isinstance(lin, GGUFLinear):
        fmt = quant_ops.GGUF_BLOCK_FORMATS[lin.fmt][0]
        w = lin.tiles if lin.q8 else lin.blocks
        return DecodeLinear(3 if lin.q8 else 1, fmt, lin.out_features, lin.in_features, w.data_ptr(), None,
                            _ptr(lin.bias))
    if isinstance(lin, GGUFBlockLinear):
        return _describe_block_linear(lin)
    if isinstance(lin, Int8Linear):
        w = lin.tiles if lin.q8 else lin.qweight
        return DecodeLinear(4 if lin.q8 else 2, 0, lin.out_features, lin.in_features, w.data_ptr(),
                            lin.scale.data_ptr(), _ptr(lin.bias))
    return None


def _max_rows(lin: nn.Module) -> int:
    """The most rows for which `lin`'s module path runs the kernel decode_layer.c runs for it: dense tiles that
    take any M, a GGUF linear's `fused_max_m` (its int8 tiles / blocks: gemv_q8.c / gemv_kquant.c, and
    gemm_kquant.c where quant_ops.tiles_run_gemm / above 16 rows, in both), else DENSE_MAX_M."""
    if getattr(lin, "any_m", False):
        return FusedDecode.MAX_ANY_M
    return getattr(lin, "fused_max_m", cpu_ops.DENSE_MAX_M)


def _describe_block_linear(lin: GGUFBlockLinear) -> DecodeLinear:
    """A GGUFBlockLinear's parts as the module path runs them in decode batches: gemv_q8.c's tiles, the blocks
    with int8 activations (bf16) or the exact float32 sums; several parts as kind 5 (the array rides on the
    record: `parts` keeps it alive)."""
    parts = []
    for (blocks, fmt), tiles, rows in zip(lin.block_parts, lin.part_tiles, lin.part_rows):
        if tiles is not None:
            parts.append(DecodeLinear(3, quant_ops.Q8_TILE_FORMATS[fmt][0], rows, lin.in_features, tiles.data_ptr(),
                                      None, None))
        else:
            parts.append(DecodeLinear(6 if lin.q8 else 7, quant_ops.GGUF_TYPES[fmt][0], rows, lin.in_features,
                                      blocks.data_ptr(), None, None))
    if len(parts) == 1:
        parts[0].bias = _ptr(lin.bias)
        return parts[0]
    arr = (DecodeLinear * len(parts))(*parts)
    d = DecodeLinear(5, len(parts), lin.out_features, lin.in_features, ctypes.addressof(arr), None, _ptr(lin.bias))
    d.parts = arr
    return d


class FusedDecode:
    MAX_ANY_M = 256  # a decode batch's scratch in decode_layer.c stays a few MB

    def __init__(self, layers: list[nn.Module], weights: list[DecodeLayerWeights], dtype: torch.dtype,
                 dims: tuple[int, ...], eps: float, scale: float, max_batch: int):
        self.layers = layers  # kept: the descriptors point into their tensors
        self.max_batch = max_batch
        self.weights = weights
        self.dtype = dtype
        self.dims = dims  # hidden, H, Hkv, D, inter
        self.eps, self.scale = eps, scale
        self._pools: Optional[tuple[object, Any, Any]] = None  # (pool, its k / v pointer arrays)

    @staticmethod
    def build(model: nn.Module, dtype: torch.dtype) -> Optional["FusedDecode"]:
        """For a LlamaForCausalLM whose every layer can run decode_layer.c; else None."""
        lib = cpu_ops.load()
        if (lib is None or dtype not in (torch.bfloat16, torch.float32) or model.reduce is not None
                or not model.rotary.full):  # decode_layer.c rotates whole heads
            return None
        weights = []
        max_batch = FusedDecode.MAX_ANY_M
        for i, layer in enumerate(model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            if (attn.q_norm is not None or attn.clip_qkv is not None or type(mlp) is not MLP
                    or type(layer) is not DecoderLayer  # other layer shapes (Gemma's pre + post norms, GeGLU)
                    or not mlp.use_cpu_kernel or not layer.input_layernorm.use_cpu_kernel):
                return None  # q/k norms, clip_qkv and MoE blocks (model/layers/moe.py) run on the modules
            mods = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            lins = [describe_linear(m) for m in mods]
            if any(d is None for d in lins):
                return None
            max_batch = min([max_batch] + [_max_rows(m) for m in mods])
            weights.append(DecodeLayerWeights(*lins, layer.input_layernorm.weight.data_ptr(),
                                              layer.post_attention_layernorm.weight.data_ptr(), i))
            weights[-1].linears = lins  # the records are copied in; kind 5's part arrays must outlive them
        a0 = model.layers[0].self_attn
        if len(a0.backend.distinct_windows) > 1 or a0.backend.sinks:  # the step carries one win_begin;
            return None  # decode_layer.c has no attention sinks (gpt-oss): the modules run
        for w, layer in zip(weights, model.layers):
            w.window = a0.backend.window(w.layer)
            w.nope = int(not getattr(layer.self_attn, "rope", True))  # a NoPE layer: rope_store.c's store only
        dims = (model.cfg.hidden_size, a0.h, a0.hkv, a0.d, model.layers[0].mlp.inter)
        return FusedDecode(list(model.layers), weights, dtype, dims, model.cfg.rms_norm_eps, a0.backend.scale,
                           max_batch)

    def applies(self, fb: ForwardBatch) -> bool:
        """This step runs the kernels decode_layer.c runs (see the module docstring)."""
        meta = fb.attn_meta
        return (fb.is_decode and fb.batch_size <= self.max_batch and isinstance(meta, CDecodeMeta)
                and meta.rows is None)

    def _pool_arrays(self, pool) -> tuple[Any, Any]:
        if self._pools is None or self._pools[0] is not pool:
            self._pools = (pool, *cpu_ops.decode_layer_pools(pool))
        return self._pools[1], self._pools[2]

    def run(self, residual: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """All layers on residual [M, hidden] (updated in place, as the module path does); returns the last
        layer's MLP output [M, hidden]."""
        pool = fb.kv_pool
        kp, vp = self._pool_arrays(pool)
        cos, sin = fb.rope_cos_sin
        hidden, H, Hkv, D, inter = self.dims
        M = residual.shape[0]
        rt = pool.req_to_token
        step = DecodeStep(M, hidden, H, Hkv, D, inter, pool.k_buffers[0].shape[1], rt.shape[1], self.eps, self.scale,
                          cos.data_ptr(), sin.data_ptr(), fb.out_loc.data_ptr(), rt.data_ptr(), fb.req_rows.data_ptr(),
                          fb.seq_lens.data_ptr(), kp, vp)
        plan = fb.attn_meta.cascade
        for b in fb.attn_meta.win_begin.values():  # windowed layers: TorchAttentionBackend.forward_decode's k_begin
            step.win_begin = b.data_ptr()
        if plan is not None:  # the same calls as TorchAttentionBackend.forward_decode's
            po, pl = fb.attn_meta.prior
            step.groups, step.dpbf16 = plan.num_groups, int(self.layers[0].self_attn.backend.dpbf16)
            step.group_rows, step.group_lens = plan.group_rows.data_ptr(), plan.group_lens.data_ptr()
            step.q_index, step.group_starts = plan.q_index.data_ptr(), plan.group_starts.data_ptr()
            step.group_counts, step.k_begin = plan.group_counts.data_ptr(), plan.k_begin.data_ptr()
            step.prior_o, step.prior_lse = po.data_ptr(), pl.data_ptr()
        return cpu_ops.decode_layers(self.weights, step, residual)
