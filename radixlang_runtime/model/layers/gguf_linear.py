"""Linears on a GGUF file's own quantized blocks (`--quantization gguf`): Q4_1 / Q8_0 repacked into tiles
(every other block type: gguf_block_linear).

The embedded model ships as Q4_1 (layers) + Q8_0 (embedding / tied head); the converted checkpoint
holds their dequantized values. With this flag the linears keep the blocks too:
- decode batches (M <= quant_ops.QLINEAR_MAX_M) run on the blocks (0.625 bytes per weight for Q4_1,
  1.06 for Q8_0, against 2 for bf16; decode reads every weight once per step):
  - bf16 models: gemv_q8.c on the blocks repacked into 4-row tiles (gguf_q8_tiles: the same bytes,
    moved), activations quantized to int8 per block of 32 as llama.cpp does (its vec_dot_q8_0_q8_0 /
    q4_1_q8_1); the integer dots are exact, the activations' rounding (<= half a step of 1/127 of the
    block's max) is the drift. Much faster than the float body below on the file's blocks, for both
    formats: the blocks stream at the memory's read rate (docs/PERFORMANCE.md#quantized-linears);
  - float32 models: gguf_gemv (gemv.c) on the file's blocks with float32 sums: the exact values the
    dequantized checkpoint holds, only the summation order differs (float32 greedy output equals
    transformers', tests/test_quantization.py);
- larger batches: bf16 models up to quant_ops.kq_gemm_max_m() rows run gemm_kquant.c on the tiles (the same
  int8 sums, each weight unpacked once for all rows); above that, and float32 models, dequantize tiles of the
  blocks per call (gguf_block_linear: no dense copy is kept, the same exact values; bf16 models first put their
  int8 tiles back into the file's layout, a transient copy);
  without the C library, a bf16 model runs a dense copy of the dequantized weight.
q/k/v and gate/up are fused by stacking block rows (every part must share one format; a linear whose
parts differ keeps the dense path). Tensor parallelism is not supported with this flag (refused).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from radixlang_kernels import cpu_ops, quant_ops
from radixlang_runtime.model.layers.packed_linear import PackedLinear, packing_available


class GGUFLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], blocks: torch.Tensor, fmt: str):
        """weight [N, K] (the dequantized values, model dtype); blocks [N, K / 32 * bytes] uint8."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        if blocks.shape[0] != self.out_features or fmt not in quant_ops.GGUF_BLOCK_FORMATS:
            raise ValueError(f"GGUF blocks {tuple(blocks.shape)} {fmt} do not fit a {tuple(weight.shape)} weight")
        if blocks.shape[1] != self.in_features // 32 * quant_ops.GGUF_BLOCK_FORMATS[fmt][1]:
            raise ValueError(f"GGUF {fmt} rows of {blocks.shape[1]} bytes do not hold {self.in_features} weights")
        self.fmt = fmt
        # bf16: the int8-activation tiles only (blocks None); float32: the file's blocks only (tiles None)
        self.q8 = weight.dtype == torch.bfloat16 and cpu_ops.load() is not None
        self.blocks: Optional[torch.Tensor] = None if self.q8 else blocks.contiguous()
        self.tiles: Optional[torch.Tensor] = quant_ops.gguf_q8_tiles(blocks, fmt) if self.q8 else None
        # the most rows whose forward runs the kernel decode_layer.c runs for it (fused_decode.py)
        self.fused_max_m = quant_ops.KQ_GEMM_MAX_M if self.q8 else quant_ops.QLINEAR_MAX_M
        self.bias = None if bias is None else bias.detach()
        self.weight: Optional[torch.Tensor] = None
        self.dense: Optional[nn.Module] = None
        self.tail: Optional[nn.Module] = None
        if weight.dtype == torch.float32:  # larger batches dequantize tiles of the blocks: no dense copy
            from radixlang_runtime.model.layers.gguf_block_linear import GGUFBlockLinear

            self.tail = GGUFBlockLinear([(self.blocks, fmt)], self.in_features, None, weight.dtype)
        elif self.q8:  # the same from the int8 tiles, put back into the file's layout per call
            self.tail = _FromTiles(self)
        elif packing_available(weight.device, weight.dtype):  # dense tiles where they serve every batch size
            self.dense = PackedLinear(weight, self.bias,
                                      tiles=cpu_ops.dense_any_m(weight.dtype, cpu_ops.load()))
        else:
            self.weight = weight.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = None
        if x.device.type == "cpu" and self.q8:
            if not quant_ops.tiles_run_gemm(x.reshape(-1, self.in_features).shape[0], self.out_features):  # else tail
                y = quant_ops.gguf_q8_gemv(x, self.tiles, self.fmt, self.out_features)
        elif x.device.type == "cpu":
            y = quant_ops.gguf_gemv(x, self.blocks, self.fmt)
        if y is None and self.tail is not None:
            y = self.tail(x)
        if y is None:
            return self.dense(x) if self.dense is not None else torch.nn.functional.linear(x, self.weight, self.bias)
        return y if self.bias is None else y + self.bias


def fused_blocks(parts: list[tuple[torch.Tensor, str]]) -> Optional[tuple[torch.Tensor, str]]:
    """Stack the block rows of q/k/v (or gate/up); None when the parts' formats differ. One part is returned as
    it is (a tied head keeps sharing the embedding's blocks)."""
    fmts = {fmt for _, fmt in parts}
    if len(fmts) != 1:
        return None
    return (parts[0][0] if len(parts) == 1 else torch.cat([b for b, _ in parts])), fmts.pop()


class GGUFTiedEmbedding(nn.Module):
    """The embedding of a bf16 model whose tied head is a GGUFLinear on int8 tiles: a token's row is read back
    from the head's tiles and dequantized, so the table is held once (as the head's tiles)."""

    def __init__(self, head: GGUFLinear, dtype: torch.dtype):
        super().__init__()
        if head.tiles is None:
            raise ValueError("GGUFTiedEmbedding reads a bf16 GGUFLinear's int8 tiles; this head keeps none")
        self.head = [head]  # not a submodule: the head owns the tiles
        self.num_embeddings, self.dim, self.dtype = head.out_features, head.in_features, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        from radixlang_runtime.model.layers.gguf_block_linear import dequant_rows

        head, flat = self.head[0], ids.reshape(-1).cpu()
        blocks = quant_ops.gguf_q8_untiles(head.tiles, head.fmt, head.out_features, head.in_features, rows=flat)
        rows = dequant_rows(blocks, head.fmt, self.dim, self.dtype)
        return rows.to(ids.device).reshape(*ids.shape, self.dim)


class _FromTiles(nn.Module):
    """A bf16 GGUFLinear's larger batches: up to quant_ops.kq_gemm_max_m() rows gemm_kquant.c on the tiles
    (gguf_q8_tiles_gemm), above that the tiles back in the file's layout (a transient copy of the same bytes),
    then gguf_block_linear's dequantized tiles and GEMM: no dense copy is kept."""

    def __init__(self, lin: GGUFLinear):
        super().__init__()
        self.lin = [lin]  # not a submodule: no cycle in modules()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from radixlang_runtime.model.layers.gguf_block_linear import GGUFBlockLinear

        lin = self.lin[0]
        if x.device.type == "cpu" and x.shape[0] <= quant_ops.kq_gemm_max_m():
            y = quant_ops.gguf_q8_tiles_gemm(x, lin.tiles, lin.fmt, lin.out_features)
            if y is not None:
                return y
        blocks = quant_ops.gguf_q8_untiles(lin.tiles, lin.fmt, lin.out_features, lin.in_features)
        return GGUFBlockLinear([(blocks, lin.fmt)], lin.in_features, None, x.dtype, tiles=False)(x)
