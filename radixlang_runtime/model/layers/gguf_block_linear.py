"""Linears and the embedding on a GGUF file's own rows of blocks, every type of quant_ops.GGUF_TYPES (Q4_0,
Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS): the default for a `.gguf` model.

Resident bytes are the file's (Q4_K / Q6_K parts of bf16 models: 1.11x / 1.33x, below): each part keeps its blocks
[rows, row bytes] uint8 exactly as stored (q / k rows unpermuted, gguf_convert.gguf_blocks), and no dense
copy exists:
- bf16 decode batches (M <= quant_ops.KQ_MAX_M): gemv_kquant.c on the blocks, activations quantized to int8
  per block as llama.cpp does (q8_K for the K-quants and IQ4_XS, q8_0 for the others); its only drift is the
  activations' rounding (kernels/tests/test_gguf_kernels.py bounds it). Q4_1 / Q5_0 / Q8_0 parts of a bf16
  model (and Q4_K's sub-blocks of 32, Q6_K's of 16) are held as gemv_q8.c's 4-row tiles instead
  (quant_ops.gguf_q8_tiles: the same bytes, moved; Q4_K's scales and Q6_K's quants unpacked to bytes;
  the same int8 sums at several times the rate);
- bf16 batches above that up to quant_ops.kq_gemm_max_m() rows (large decode batches, short prefills; every
  batch on a CPU without native bf16 GEMMs):
  gemm_kquant.c, the same int8 sums with each weight unpacked once for all rows, register-tiled, on the
  blocks or on the tiles (gguf_q8_tiles_gemm: no copy of the blocks); a fused linear's parts write their
  columns of one output; larger batches take the blocks back from the tiles per call (a transient copy);
- float32 decode batches (M <= quant_ops.KQ_EXACT_MAX_M): gguf_dequant_gemv, float32 sums over each chunk's
  exact dequantized values;
- larger batches and builds without the library: a tile of TILE_BYTES of rows dequantized at a time
  (gguf_dequant.c: gguf.quants' exact values) and a GEMM on it; so float32 outputs are the dequantized
  checkpoint's up to summation order (greedy parity with transformers holds token for token);
- the embedding looks up its tokens' rows the same way (a tied output head shares its blocks).
A fused linear (q / k / v, gate / up) holds one part per projection, each in its own type (a Q4_K_M file
mixes Q4_K and Q6_K): the parts' outputs are concatenated.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import nn

from radixlang_kernels import cpu_ops, quant_ops
TILE_BYTES = 1 << 21  # dequantized rows per GEMM call: 2 MB of the model dtype (stays in L2 / L3)


def _dequant_numpy(blocks: torch.Tensor, fmt: str, K: int, dtype: torch.dtype) -> torch.Tensor:
    """The reference dequantizer (no C library): gguf.quants on the rows given."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    w = dequantize(blocks.numpy(), GGMLQuantizationType[fmt]).reshape(blocks.shape[0], K)
    return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)).to(dtype)


def dequant_rows(blocks: torch.Tensor, fmt: str, K: int, dtype: torch.dtype, rows: Optional[torch.Tensor] = None,
                 row0: int = 0, n_rows: Optional[int] = None) -> torch.Tensor:
    """Rows of `blocks` (rows [R] int64, else row0 .. row0 + n_rows) -> [R, K] dtype."""
    w = quant_ops.gguf_dequant_rows(blocks, fmt, K, dtype, rows=rows, row0=row0, n_rows=n_rows)
    if w is not None:
        return w
    if rows is not None:
        return _dequant_numpy(blocks[rows], fmt, K, dtype)
    n = blocks.shape[0] - row0 if n_rows is None else n_rows
    return _dequant_numpy(blocks[row0:row0 + n], fmt, K, dtype)


def check_blocks(blocks: torch.Tensor, fmt: str, in_features: int) -> None:
    if fmt not in quant_ops.GGUF_TYPES:
        raise ValueError(f"GGUF block type {fmt} is not supported on its blocks (supported: "
                         f"{', '.join(quant_ops.GGUF_TYPES)})")
    _, qk, nbytes = quant_ops.GGUF_TYPES[fmt]
    row_bytes = in_features // qk * nbytes
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or in_features % qk or blocks.shape[1] != row_bytes:
        raise ValueError(f"GGUF {fmt} blocks {tuple(blocks.shape)} do not hold rows of {in_features} weights")


class GGUFBlockLinear(nn.Module):
    def __init__(self, parts: list[tuple[torch.Tensor, str]], in_features: int, bias: Optional[torch.Tensor],
                 dtype: torch.dtype, tiles: bool = True):
        """parts: (blocks [N_i, row bytes] uint8, type) per projection, outputs in that order; bias [sum N_i].
        tiles False: every part keeps its blocks (a tied head whose embedding shares them)."""
        super().__init__()
        for blocks, fmt in parts:
            check_blocks(blocks, fmt, in_features)
        self.in_features = in_features
        self.out_features = sum(b.shape[0] for b, _ in parts)
        self.part_rows = [b.shape[0] for b, _ in parts]
        self.dtype = dtype
        self.bias = None if bias is None else bias.detach()
        self.fmts = tuple(fmt for _, fmt in parts)
        self.q8 = dtype == torch.bfloat16 and cpu_ops.load() is not None  # int8 activations in decode batches
        # per part: its blocks as stored, or (bf16, Q4_1 / Q5_0 / Q8_0) gemv_q8.c's tiles of them, not both
        tiled = [tiles and self.q8 and fmt in quant_ops.Q8_TILE_FORMATS for _, fmt in parts]
        self.part_tiles = [quant_ops.gguf_q8_tiles(b, fmt) if t else None for (b, fmt), t in zip(parts, tiled)]
        # the most rows whose forward runs the kernels decode_layer.c runs for these parts (fused_decode.py)
        self.fused_max_m = quant_ops.KQ_GEMM_MAX_M if self.q8 else quant_ops.KQ_EXACT_MAX_M
        self.block_parts = [(None if t else b.contiguous(), fmt) for (b, fmt), t in zip(parts, tiled)]

    def _blocks(self, i: int) -> torch.Tensor:
        """Part i's rows of blocks in the file's layout (from its tiles: a transient copy)."""
        blocks, fmt = self.block_parts[i]
        if blocks is not None:
            return blocks
        return quant_ops.gguf_q8_untiles(self.part_tiles[i], fmt, self.part_rows[i], self.in_features)

    def _part(self, x: torch.Tensor, i: int) -> torch.Tensor:
        fmt, tiles = self.block_parts[i][1], self.part_tiles[i]
        y = None
        if x.device.type == "cpu" and tiles is not None:
            gemm = quant_ops.tiles_run_gemm(x.shape[0], self.part_rows[i])
            y = (quant_ops.gguf_q8_tiles_gemm if gemm else quant_ops.gguf_q8_gemv)(x, tiles, fmt, self.part_rows[i])
        elif x.device.type == "cpu":
            y = quant_ops.gguf_kq_gemv(x, self.block_parts[i][0], fmt, exact=self.dtype == torch.float32)
        if y is not None:
            return y
        blocks = self._blocks(i)
        N, K = blocks.shape[0], self.in_features
        step = max(1, TILE_BYTES // (K * x.element_size()))
        if step >= N:
            return x @ dequant_rows(blocks, fmt, K, x.dtype).to(x.device).T
        out = torch.empty(x.shape[0], N, dtype=x.dtype, device=x.device)  # [M, N]
        for r0 in range(0, N, step):  # the blocks stay in host memory: a GPU receives each tile
            n = min(step, N - r0)
            tile = dequant_rows(blocks, fmt, K, x.dtype, row0=r0, n_rows=n).to(x.device)
            torch.matmul(x, tile.T, out=out[:, r0:r0 + n])
        return out

    def _gemm(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """bf16 batches of KQ_MAX_M .. kq_gemm_max_m() rows: every part's int8 GEMM into its columns."""
        M = x.shape[0]
        if not self.q8 or x.device.type != "cpu" or not quant_ops.KQ_MAX_M < M <= quant_ops.kq_gemm_max_m():
            return None
        out = torch.empty(M, self.out_features, dtype=x.dtype)
        c0 = 0
        for i, (blocks, fmt) in enumerate(self.block_parts):
            n, tiles = self.part_rows[i], self.part_tiles[i]
            if tiles is not None:
                if quant_ops.gguf_q8_tiles_gemm(x, tiles, fmt, n, out=out[:, c0:c0 + n]) is None:
                    return None
            elif quant_ops.gguf_kq_gemm(x, blocks, fmt, out=out[:, c0:c0 + n]) is None:
                return None
            c0 += n
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        y = self._gemm(x2)
        if y is not None:
            y = y if self.bias is None else y + self.bias
            return y.reshape(*x.shape[:-1], self.out_features)
        ys = [self._part(x2, i) for i in range(len(self.block_parts))]
        y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=1)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


class GGUFEmbedding(nn.Module):
    def __init__(self, blocks: torch.Tensor, fmt: str, dim: int, dtype: torch.dtype):
        """blocks [vocab, dim / QK * bytes] uint8: token t's row dequantized at lookup."""
        super().__init__()
        check_blocks(blocks, fmt, dim)
        self.blocks, self.fmt, self.dim, self.dtype = blocks.contiguous(), fmt, dim, dtype
        self.num_embeddings = blocks.shape[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).cpu()
        rows = dequant_rows(self.blocks, self.fmt, self.dim, self.dtype, rows=flat)
        return rows.to(ids.device).reshape(*ids.shape, self.dim)
