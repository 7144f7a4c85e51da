"""The quantized linears of the op table: int8 (qlinear_int8, gemv.c; int8_q8_gemv, gemv_q8.c) and GGUF blocks
(gguf_gemv, gemv.c; gguf_q8_gemv, gemv_q8.c; gguf_kq_gemv, gemv_kquant.c; gguf_dequant_rows, gguf_dequant.c)
for decode-sized batches (gguf_kq_gemm, gemm_kquant.c: many rows), with the weight layouts they read. Same
conventions as cpu_ops.py (its load() and status check): tensors in, the entry point of the same name in
csrc/cpu/kernels.h called, None where the library is absent."""

from __future__ import annotations

from typing import Any, Optional

import torch

from radixlang_kernels.cpu_caps import detect
from radixlang_kernels.cpu_ops import check_status, loaded, opt_ptr
from radixlang_kernels.op_table import OpTable

QLINEAR_MAX_M = 16  # gemv.c's limit: larger batches run a GEMM


def _gemv(name: str, x: torch.Tensor, n_out: int, lib: Optional[OpTable], *ptrs: Any) -> Optional[torch.Tensor]:
    """Call gemv.c's `name`_{bf16,f32}(x, *ptrs, out, M, K, N): out [M, n_out] like x, or None when the
    library is not loaded, x's dtype has no entry point or M > QLINEAR_MAX_M (the caller's GEMM runs)."""
    lib = lib or loaded()
    M, K = x.shape
    if lib is None or M > QLINEAR_MAX_M or x.dtype not in (torch.bfloat16, torch.float32):
        return None
    x = x.contiguous()
    out = torch.empty(M, n_out, dtype=x.dtype)
    fn = getattr(lib, f"{name}_{'bf16' if x.dtype == torch.bfloat16 else 'f32'}")
    check_status(fn(x.data_ptr(), *ptrs, out.data_ptr(), M, K, n_out), name)
    return out


def qlinear_int8(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> Optional[torch.Tensor]:
    """x [M, K] bf16 / float32, w [N, K] int8, scale [N] float32 -> x @ (w * scale).T [M, N] like x;
    None when the library is not loaded or M > QLINEAR_MAX_M (the caller's torch path runs)."""
    return _gemv("qlinear_int8", x, w.shape[0], None, w.data_ptr(), scale.data_ptr())


GGUF_BLOCK_FORMATS = {"Q4_1": (2, 20), "Q8_0": (8, 34)}  # name -> (ggml type number, bytes per 32 weights)


def gguf_gemv(x: torch.Tensor, blocks: torch.Tensor, fmt: str,
              lib: Optional[OpTable] = None) -> Optional[torch.Tensor]:
    """x [M, K] bf16 / float32, blocks [N, K / 32 * bytes] uint8 (rows of GGUF Q4_1 / Q8_0 blocks) ->
    x @ dequantize(blocks).T [M, N] like x; None when the library is not loaded or M > QLINEAR_MAX_M."""
    return _gemv("gguf_gemv", x, blocks.shape[0], lib, blocks.data_ptr(), GGUF_BLOCK_FORMATS[fmt][0])


Q8_TILE_ROWS = 4  # gemv_q8.c's Q8_ROWS


# gemv_q8.c's tile formats: name -> (its format number, the file's bytes per 32 weights); the K-quants' tiles
# hold more than the file (Q4_K 160 B per 256 weights against 144, Q6_K 280 against 210: scales as bytes, the
# 6-bit quants as int8)
Q8_TILE_FORMATS = {"Q4_1": (2, 20), "Q5_0": (6, 22), "Q8_0": (8, 34), "Q4_K": (12, 18), "Q6_K": (14, 26.25)}


def _super_blocks(blocks: torch.Tensor, nbytes: int) -> tuple[torch.Tensor, int, int]:
    """K-quant rows [N, nsb * nbytes] -> (super-blocks [4 tiles' rows, nsb, nbytes] with zero padding rows,
    tiles, nsb)."""
    N, nsb = blocks.shape[0], blocks.shape[1] // nbytes
    nt = -(-N // Q8_TILE_ROWS)
    b = torch.zeros(nt * Q8_TILE_ROWS, nsb, nbytes, dtype=torch.uint8)
    b[:N] = blocks.reshape(N, nsb, nbytes)
    return b, nt, nsb


def _steps(per_pair: list[torch.Tensor], nt: int, pairs: int) -> torch.Tensor:
    """Fields [rows, ..., per step] of each row -> tiles [nt, pairs, step]: a step's 4 rows of each field in turn."""
    return torch.cat([t.reshape(nt, Q8_TILE_ROWS, pairs, -1).permute(0, 2, 1, 3).reshape(nt, pairs, -1)
                      for t in per_pair], dim=-1).contiguous()


def _q6k_quants(b: torch.Tensor) -> torch.Tensor:
    """Q6_K super-blocks [..., 210] -> their 256 quants q in 0 .. 63 [..., 256] (w = d sc[i / 16] (q - 32)):
    per half of 128, ql [64] holds the low 4 bits and qh [32] the high 2 of 4 runs of 32."""
    out = []
    for h in range(2):
        ql, qh = b[..., 64 * h:64 * h + 64].to(torch.int16), b[..., 128 + 32 * h:160 + 32 * h].to(torch.int16)
        lo = [ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4]
        out += [lo[k] | (((qh >> (2 * k)) & 3) << 4) for k in range(4)]
    return torch.cat(out, dim=-1)


def _q6k_blocks(q: torch.Tensor, sc: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """_q6k_quants' inverse: q [..., 256] in 0 .. 63, sc [..., 16] int8 as uint8, d [..., 2] -> [..., 210]."""
    ql, qh = [], []
    for h in range(2):
        r = [q[..., 128 * h + 32 * k:128 * h + 32 * k + 32] for k in range(4)]
        ql += [(r[0] & 15) | ((r[2] & 15) << 4), (r[1] & 15) | ((r[3] & 15) << 4)]
        qh.append(sum((r[k] >> 4) << (2 * k) for k in range(4)))
    return torch.cat([*ql, *qh, sc, d], dim=-1).to(torch.uint8)


def _q6k_tiles(blocks: torch.Tensor) -> torch.Tensor:
    """Q6_K rows [N, K / 256 * 210] -> tiles [ceil(N / 4), K / 64, 280]: per step (64 weights of a super-block)
    d fp16 [4 rows] | sc int8 [4 rows][4] (one per 16 weights) | q - 32 int8 [4 rows][64]."""
    b, nt, nsb = _super_blocks(blocks, 210)
    pairs = nsb * 4
    q = (_q6k_quants(b) - 32).to(torch.int8).view(torch.uint8)
    per_pair = [b[..., None, 208:210].expand(-1, -1, 4, 2), b[..., 192:208].reshape(-1, nsb, 4, 4),
                q.reshape(-1, nsb, 4, 64)]
    return _steps(per_pair, nt, pairs)


def _q6k_untiles(tiles: torch.Tensor) -> torch.Tensor:
    """_q6k_tiles' inverse for tiles [T, pairs, 280] -> rows [T, 4, K / 256 * 210] (each tile's 4 rows)."""
    T, pairs, _ = tiles.shape
    nsb = pairs // 4
    t = tiles.reshape(T, nsb, 4, 280)
    d = t[:, :, 0, 0:8].reshape(T, nsb, 4, 2).permute(0, 2, 1, 3)
    sc = t[..., 8:24].reshape(T, nsb, 4, 4, 4).permute(0, 3, 1, 2, 4).reshape(T, 4, nsb, 16)
    q = t[..., 24:].view(torch.int8).reshape(T, nsb, 4, 4, 64).permute(0, 3, 1, 2, 4).reshape(T, 4, nsb, 256)
    return _q6k_blocks(q.to(torch.int16) + 32, sc, d).reshape(T, 4, nsb * 210)


def _q4k_scale_min(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q4_K super-block's 12 scale bytes [..., 12] -> its 8 sub-blocks' 6-bit scales and mins [..., 8] each."""
    lo, mid, hi = q[..., 0:4], q[..., 4:8], q[..., 8:12]
    sc = torch.cat([lo & 63, (hi & 15) | ((lo >> 6) << 4)], dim=-1)
    mn = torch.cat([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], dim=-1)
    return sc, mn


def _q4k_scale_bytes(sc: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """_q4k_scale_min's inverse: [..., 8] scales and mins -> the 12 bytes."""
    return torch.cat([sc[..., :4] | ((sc[..., 4:] >> 4) << 6), mn[..., :4] | ((mn[..., 4:] >> 4) << 6),
                      (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)], dim=-1)


def _q4k_tiles(blocks: torch.Tensor) -> torch.Tensor:
    """Q4_K rows [N, K / 256 * 144] -> tiles [ceil(N / 4), K / 64, 160]: per step (a 64-weight group of a
    super-block) d [4 rows] | dmin [4] fp16 | sc [4][2] | m [4][2] u8 | the group's 32 bytes per row."""
    b, nt, nsb = _super_blocks(blocks, 144)
    pairs = nsb * 4
    sc, mn = _q4k_scale_min(b[..., 4:16])
    per_pair = [b[..., None, 0:2].expand(-1, -1, 4, 2), b[..., None, 2:4].expand(-1, -1, 4, 2),
                sc.reshape(-1, nsb, 4, 2), mn.reshape(-1, nsb, 4, 2), b[..., 16:].reshape(-1, nsb, 4, 32)]
    return _steps(per_pair, nt, pairs)


def _q4k_untiles(tiles: torch.Tensor) -> torch.Tensor:
    """_q4k_tiles' inverse for tiles [T, pairs, 160] -> rows [T, 4, K / 256 * 144] (each tile's 4 rows)."""
    T, pairs, _ = tiles.shape
    nsb = pairs // 4
    t = tiles.reshape(T, nsb, 4, 160)
    d, dmin = t[:, :, 0, 0:8].reshape(T, nsb, 4, 2), t[:, :, 0, 8:16].reshape(T, nsb, 4, 2)
    sc = t[..., 16:24].reshape(T, nsb, 4, 4, 2).permute(0, 3, 1, 2, 4).reshape(T, 4, nsb, 8)
    mn = t[..., 24:32].reshape(T, nsb, 4, 4, 2).permute(0, 3, 1, 2, 4).reshape(T, 4, nsb, 8)
    qs = t[..., 32:].reshape(T, nsb, 4, 4, 32).permute(0, 3, 1, 2, 4).reshape(T, 4, nsb, 128)
    rows = torch.cat([d.permute(0, 2, 1, 3), dmin.permute(0, 2, 1, 3), _q4k_scale_bytes(sc, mn), qs], dim=-1)
    return rows.reshape(T, 4, nsb * 144)


def gguf_q8_tiles(blocks: torch.Tensor, fmt: str) -> torch.Tensor:
    """blocks [N, K / 32 * bytes] uint8 (rows of GGUF Q4_1 / Q5_0 / Q8_0 blocks) -> gemv_q8.c's tiles
    [ceil(N / 4), pairs, step] uint8 (pairs = ceil(K / 64); step 272 B for Q8_0, 160 for Q4_1, 176 for Q5_0):
    the same scales and quants, moved so a step's 4 rows x 2 blocks are one run (padding rows / blocks are
    zeros). Q4_K / Q6_K: their own steps (_q4k_tiles, _q6k_tiles), K % 256 == 0."""
    if fmt in ("Q4_K", "Q6_K"):
        return (_q4k_tiles if fmt == "Q4_K" else _q6k_tiles)(blocks)
    _, nbytes = Q8_TILE_FORMATS[fmt]
    N = blocks.shape[0]
    nb = blocks.shape[1] // nbytes
    nt, pairs = -(-N // Q8_TILE_ROWS), -(-nb // 2)
    b = torch.zeros(nt * Q8_TILE_ROWS, pairs * 2, nbytes, dtype=torch.uint8)
    b[:N, :nb] = blocks.reshape(N, nb, nbytes)
    b = b.view(nt, Q8_TILE_ROWS, pairs, 2, nbytes).permute(0, 2, 1, 3, 4)  # [tile, pair, row, block, bytes]
    if fmt == "Q8_0":
        parts = [b[..., :2], b[..., 2:]]  # dw [4][2] fp16, then each row's 2 blocks of int8
    else:  # dw, mw (Q4_1) or qh (Q5_0), then byte i = qw_b0[i] | qw_b1[i] << 4 (the file: qw[j] | qw[j + 16] << 4)
        qs = b[..., 4:] if fmt == "Q4_1" else b[..., 6:]
        q = torch.cat([qs & 15, qs >> 4], dim=-1)  # [..., block, 32] weights' low 4 bits in order
        parts = [b[..., :2], b[..., 2:4] if fmt == "Q4_1" else b[..., 2:6],
                 (q[..., 0, :] | (q[..., 1, :] << 4)).unsqueeze(-2)]
    return torch.cat([p.reshape(nt, pairs, -1) for p in parts], dim=-1).contiguous()


def gguf_q8_untiles(tiles: torch.Tensor, fmt: str, N: int, K: int, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """gguf_q8_tiles' inverse: tiles [ceil(N / 4), pairs, step] uint8 -> blocks [N, K / 32 * bytes], or
    only the rows `rows` [R] int64 (in that order) -> [R, K / 32 * bytes]."""
    if rows is not None:
        tiles = tiles[rows // 4]
    nt, pairs, _ = tiles.shape
    nbytes = Q8_TILE_FORMATS[fmt][1]
    if fmt in ("Q4_K", "Q6_K"):
        b = (_q4k_untiles if fmt == "Q4_K" else _q6k_untiles)(tiles)
        return (b[torch.arange(nt), rows % 4] if rows is not None else b.reshape(nt * 4, -1)[:N]).contiguous()
    if fmt == "Q8_0":  # dw [4 rows][2 blocks] fp16 | qw [4 rows][2 blocks][32]
        parts = [tiles[..., :16].reshape(nt, pairs, 4, 2, 2), tiles[..., 16:].reshape(nt, pairs, 4, 2, 32)]
    else:  # dw [4][2] fp16, mw [4][2] fp16 (Q4_1) or qh [4][2] 4 B (Q5_0) | [4 rows][32 B],
        # byte i = qw_b0[i] | qw_b1[i] << 4 (low 4 bits); the file: qw[j] | qw[j + 16] << 4
        mid = 16 if fmt == "Q4_1" else 32
        y = tiles[..., 16 + mid:].reshape(nt, pairs, 4, 1, 32)
        q = torch.cat([y & 15, y >> 4], dim=3)  # [nt, pairs, 4 rows, 2 blocks, 32 weights]
        parts = [tiles[..., :16].reshape(nt, pairs, 4, 2, 2),
                 tiles[..., 16:16 + mid].reshape(nt, pairs, 4, 2, mid // 8), q[..., :16] | (q[..., 16:] << 4)]
    b = torch.cat(parts, dim=-1)  # [nt, pairs, 4 rows, 2 blocks, bytes]
    if rows is not None:  # each selected tile's own row
        return b[torch.arange(nt), :, rows % 4].reshape(nt, pairs * 2 * nbytes)[:, :K // 32 * nbytes].contiguous()
    b = b.permute(0, 2, 1, 3, 4).reshape(nt * 4, pairs * 2 * nbytes)
    return b[:N, :K // 32 * nbytes].contiguous()


def int8_q8_tiles(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] int8 (K % 32 == 0) -> gemv_q8.c's INT8 tiles [ceil(N / 4), ceil(K / 64), 256] uint8: each
    step 4 rows x 64 values (padding zeros)."""
    N, K = q.shape
    nt, pairs = -(-N // Q8_TILE_ROWS), -(-K // 64)
    t = torch.zeros(nt * Q8_TILE_ROWS, pairs * 64, dtype=torch.int8)
    t[:N, :K] = q
    return t.view(nt, Q8_TILE_ROWS, pairs, 64).permute(0, 2, 1, 3).reshape(nt, pairs, -1).view(torch.uint8).contiguous()


def _q8_call(name: str, x: torch.Tensor, tiles: torch.Tensor, arg: Any, n_out: int,
             out_dtype: Optional[torch.dtype], lib: Optional[OpTable]) -> Optional[torch.Tensor]:
    lib = lib or loaded()
    M, K = x.shape
    if lib is None or M > QLINEAR_MAX_M or x.dtype not in (torch.bfloat16, torch.float32):
        return None
    x = x.contiguous()
    out = torch.empty(M, n_out, dtype=out_dtype or x.dtype)
    rc = getattr(lib, name)(x.data_ptr(), int(x.dtype == torch.bfloat16), tiles.data_ptr(), arg, out.data_ptr(),
                            int(out.dtype == torch.bfloat16), M, K, n_out)
    check_status(rc, name)
    return out


def gguf_q8_gemv(x: torch.Tensor, tiles: torch.Tensor, fmt: str, n_out: int, out_dtype: Optional[torch.dtype] = None,
                 lib: Optional[OpTable] = None) -> Optional[torch.Tensor]:
    """gemv_q8.c: x [M, K] bf16 / float32, quantized to int8 per block of 32, @ W.T with W given as
    gguf_q8_tiles -> [M, n_out] (out_dtype, default x's); None when the library is not loaded or
    M > QLINEAR_MAX_M (the caller's GEMM runs)."""
    return _q8_call("gguf_q8_gemv", x, tiles, Q8_TILE_FORMATS[fmt][0], n_out, out_dtype, lib)


def int8_q8_gemv(x: torch.Tensor, tiles: torch.Tensor, scale: torch.Tensor, out_dtype: Optional[torch.dtype] = None,
                 lib: Optional[OpTable] = None) -> Optional[torch.Tensor]:
    """The same on int8_q8_tiles(Q) with row scales scale [N] float32: x @ (Q * scale).T."""
    return _q8_call("int8_q8_gemv", x, tiles, scale.data_ptr(), scale.shape[0], out_dtype, lib)


# gemv_kquant.c / gguf_dequant.c's block types: name -> (ggml type number, weights per block, bytes per block)
GGUF_TYPES = {"Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24),
              "Q8_0": (8, 32, 34), "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144),
              "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210), "IQ4_NL": (20, 32, 18), "IQ4_XS": (23, 256, 136)}
# rows of x up to which the block kernels beat dequantized tiles (gguf_dequant_rows) + a GEMM, the caller's path
# above (the kernels take up to 256): int8 activations against a bf16 GEMM, and the exact float32 sums against
# a float32 GEMM (docs/MODELS.md, GGUF blocks: the crossover measured per path)
KQ_MAX_M = 16
KQ_EXACT_MAX_M = 64
# bf16 rows up to which gguf_kq_gemm (gemm_kquant.c) beats dequantized tiles + a bf16 GEMM, above KQ_MAX_M
KQ_GEMM_MAX_M = 128
# bf16 rows from which gemv_q8.c's tiles of up to KQ_TILES_GEMM_MAX_N rows run gemm_kquant.c's panels instead (at 16
# rows quicker on every layer shape measured, [576 .. 3072, K]; slower on Q8_0 [16384 / 49152, 576], a head over the
# vocabulary: docs/MODELS.md); decode_layer.c's Q8_TILES_GEMM_MIN_M / _MAX_N, the same rule
KQ_TILES_GEMM_MIN_M = 16
KQ_TILES_GEMM_MAX_N = 8192


def tiles_run_gemm(M: int, N: int) -> bool:
    """Whether M rows against N rows of gemv_q8.c's tiles run gguf_q8_tiles_gemm (else gguf_q8_gemv)."""
    return M > KQ_MAX_M or (M >= KQ_TILES_GEMM_MIN_M and N <= KQ_TILES_GEMM_MAX_N)


def kq_gemm_max_m() -> int:
    """The bf16 rows up to which GGUF linears run gemm_kquant.c: KQ_GEMM_MAX_M where bf16 GEMMs run natively
    (AVX512-BF16 / AMX: the dequantized tiles' GEMM is quicker above), every batch where oneDNN emulates them
    (the int8 GEMM is several times quicker at prefill sizes there: docs/MODELS.md, GGUF blocks)."""
    return KQ_GEMM_MAX_M if detect().native_bf16 else 1 << 62


def gguf_kq_gemv(x: torch.Tensor, blocks: torch.Tensor, fmt: str, out_dtype: Optional[torch.dtype] = None,
                 lib: Optional[OpTable] = None, exact: bool = False) -> Optional[torch.Tensor]:
    """gemv_kquant.c: x [M, K] bf16 / float32, quantized to int8 per block (q8_K / q8_0), @ W.T with W
    given as the file's rows blocks [N, K / QK * bytes] uint8 of GGUF_TYPES[fmt] -> [M, N] (out_dtype,
    default x's); exact: gguf_dequant_gemv instead (float32 sums over the exact dequantized values, x as
    given). None when the library is not loaded or M > KQ_MAX_M (exact: KQ_EXACT_MAX_M; the caller's tiles run)."""
    lib = lib or loaded()
    M, K = x.shape
    if lib is None or M == 0 or M > (KQ_EXACT_MAX_M if exact else KQ_MAX_M) or x.dtype not in (torch.bfloat16,
                                                                                                 torch.float32):
        return None
    x = x.contiguous()
    out = torch.empty(M, blocks.shape[0], dtype=out_dtype or x.dtype)
    name = "gguf_dequant_gemv" if exact else "gguf_kq_gemv"
    rc = getattr(lib, name)(x.data_ptr(), int(x.dtype == torch.bfloat16), blocks.data_ptr(), GGUF_TYPES[fmt][0],
                            out.data_ptr(), int(out.dtype == torch.bfloat16), M, K, blocks.shape[0])
    check_status(rc, name)
    return out


def gguf_kq_gemm(x: torch.Tensor, blocks: torch.Tensor, fmt: str, out: Optional[torch.Tensor] = None,
                 out_dtype: Optional[torch.dtype] = None, lib: Optional[OpTable] = None) -> Optional[torch.Tensor]:
    """gemm_kquant.c: gguf_kq_gemv's int8-activation sums for any number of rows x [M, K] (bf16 / float32),
    each weight unpacked once per call and reused by every row. out: a [M, >= N] view with unit column stride
    to write into (e.g. a fused linear's columns), else a new [M, N] of out_dtype (default x's). None when the
    library is not loaded or x is not bf16 / float32 (the caller's tiles run)."""
    return _gemm_call("gguf_kq_gemm", x, blocks, GGUF_TYPES[fmt][0], blocks.shape[0], out, out_dtype, lib)


def _gemm_call(name: str, x: torch.Tensor, w: torch.Tensor, fmt: int, N: int, out: Optional[torch.Tensor],
               out_dtype: Optional[torch.dtype], lib: Optional[OpTable]) -> Optional[torch.Tensor]:
    """gemm_kquant.c's entry point `name` (the file's blocks or the tiles, format number fmt) into out or a new
    [M, N] tensor; None when the library is not loaded or x is not bf16 / float32."""
    lib = lib or loaded()
    M, K = x.shape
    if lib is None or M == 0 or x.dtype not in (torch.bfloat16, torch.float32):
        return None
    x = x.contiguous()
    if out is None:
        out = torch.empty(M, N, dtype=out_dtype or x.dtype)
    if out.shape[0] != M or out.shape[1] < N or out.stride(1) != 1 or out.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"{name}: out {tuple(out.shape)} {out.dtype} cannot hold [{M}, {N}] in rows")
    rc = getattr(lib, name)(x.data_ptr(), int(x.dtype == torch.bfloat16), w.data_ptr(), fmt, out.data_ptr(),
                            int(out.dtype == torch.bfloat16), M, K, N, out.stride(0))
    check_status(rc, name)
    return out


def gguf_q8_tiles_gemm(x: torch.Tensor, tiles: torch.Tensor, fmt: str, n_out: int,
                       out: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None,
                       lib: Optional[OpTable] = None) -> Optional[torch.Tensor]:
    """gemm_kquant.c on gguf_q8_tiles (n_out rows): gguf_q8_gemv's sums (activations per block of 32) for any
    number of rows x [M, K], each weight unpacked once per call. out as gguf_kq_gemm's. None when the library is
    not loaded or x is not bf16 / float32."""
    return _gemm_call("gguf_q8_tiles_gemm", x, tiles, Q8_TILE_FORMATS[fmt][0], n_out, out, out_dtype, lib)


def gguf_dequant_rows(blocks: torch.Tensor, fmt: str, K: int, dtype: torch.dtype, rows: Optional[torch.Tensor] = None,
                      row0: int = 0, n_rows: Optional[int] = None,
                      lib: Optional[OpTable] = None) -> Optional[torch.Tensor]:
    """gguf_dequant.c: rows `rows` [R] int64 (else row0 .. row0 + n_rows) of blocks [N, row bytes] uint8 ->
    [R, K] dtype (bf16 / float32), the values gguf.quants.dequantize gives; None without the library."""
    lib = lib or loaded()
    if lib is None or dtype not in (torch.bfloat16, torch.float32):
        return None
    if rows is not None:
        rows = rows.to(torch.int64).contiguous()
    R = rows.shape[0] if rows is not None else (blocks.shape[0] - row0 if n_rows is None else n_rows)
    out = torch.empty(R, K, dtype=dtype)
    rc = lib.gguf_dequant_rows(blocks.data_ptr(), GGUF_TYPES[fmt][0], K, opt_ptr(rows), row0, R, out.data_ptr(),
                               int(dtype == torch.bfloat16))
    check_status(rc, "gguf_dequant_rows")
    return out
