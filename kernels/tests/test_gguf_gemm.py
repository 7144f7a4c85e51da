"""gemm_kquant.c (gguf_kq_gemm, the int8-activation GEMM for many rows) on every GGUF block type, once per
instruction set this machine has (the `isa` fixture: AVX512-VNNI, AVX512BW, AVX2, plain C).

The reference quantizes the activations as llama.cpp's q8_K / q8_0 do (dx = max|x| / 127 per block, qx =
round(x / dx) to nearest even; sx = sum(x) per sub-block of 16) and sums in float64: per weight
w_j = s q_j + o (gguf_blocks.h), the kernel's value is sum_j w_j dx_j qx_j + sum_k o_k (sx_k - dx_k sum qx_k),
the integer dots being exact, so only float32 rounding separates the two. Against the dequantized float GEMM
the error is the activations' rounding, bounded as test_gguf_kernels.py bounds the decode kernel."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from radixlang_kernels import cpu_ops, quant_ops
from radixlang_kernels.cpu_caps import detect
from radixlang_kernels.testing import isas, random_gguf_blocks, use_isa_library

pytestmark = pytest.mark.skipif(detect().compiler is None, reason="no C compiler: torch fallback in use")
TYPES = list(quant_ops.GGUF_TYPES)


@pytest.fixture(params=isas())
def isa(request, monkeypatch):
    return use_isa_library(request.param, monkeypatch)


def _half(blocks: np.ndarray, off: int) -> np.ndarray:
    return blocks[:, off:off + 2].copy().view(np.float16)[:, 0].astype(np.float32)


def _mins(blocks: np.ndarray, fmt: str, K: int) -> np.ndarray:
    """[N, K / 16] float32: each sub-block's o (w = s q + o); zeros for the types without a min."""
    _, qk, nbytes = quant_ops.GGUF_TYPES[fmt]
    N = blocks.shape[0]
    b = blocks.reshape(N * K // qk, nbytes)
    if fmt in ("Q4_1", "Q5_1"):
        o = np.repeat(_half(b, 2)[:, None], 2, axis=1)  # per 32: two sub-blocks
    elif fmt == "Q2_K":
        o = -(_half(b, 82)[:, None] * (b[:, :16] >> 4).astype(np.float32))
    elif fmt in ("Q4_K", "Q5_K"):
        p = b[:, 4:16].astype(np.int32)
        mn = np.concatenate([p[:, 4:8] & 63, (p[:, 8:12] >> 4) | ((p[:, 4:8] >> 2) & 0x30)], axis=1)  # [., 8]
        o = np.repeat(-(_half(b, 2)[:, None] * mn.astype(np.float32)), 2, axis=1)
    else:
        return np.zeros((N, K // 16), np.float32)
    return o.reshape(N, K // 16).astype(np.float32)


def _q8(x: np.ndarray, qx_len: int):
    """llama.cpp's activation quantization: (dx per element, qx) float32, sx [M, K / 16]."""
    M, K = x.shape
    blk = x.reshape(M, K // qx_len, qx_len)
    amax = np.abs(blk).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    qx = np.rint(blk * inv).reshape(M, K)
    dx = np.repeat((amax / np.float32(127)).astype(np.float32).reshape(M, -1), qx_len, axis=1)
    return dx, qx, x.reshape(M, K // 16, 16).sum(-1, dtype=np.float64)


def _reference(x: np.ndarray, blocks: np.ndarray, fmt: str, K: int, qx_len: int = 0):
    """(the kernel's sums in float64, a float32 rounding slack) for x [M, K] float32, the activations
    quantized per qx_len (default: q8_K for the 256-blocks, q8_0 for the others)."""
    w = dequantize(blocks, GGMLQuantizationType[fmt]).astype(np.float64)  # [N, K]
    dx, qx, sx = _q8(x, qx_len or (256 if quant_ops.GGUF_TYPES[fmt][1] == 256 else 32))
    xq = dx.astype(np.float64) * qx
    o = _mins(blocks, fmt, K).astype(np.float64)  # [N, K / 16]
    dsum = xq.reshape(x.shape[0], K // 16, 16).sum(-1)  # dx_k sum qx_k
    ref = xq @ w.T + (sx - dsum) @ o.T
    slack = 2e-6 * (np.abs(xq) @ np.abs(w).T + np.abs(sx) @ np.abs(o).T) + 1e-6
    return ref, slack


def _case(fmt: str, N: int, K: int, seed: int):
    blocks = random_gguf_blocks(fmt, N, K, 0.05, np.random.default_rng(seed))
    return blocks, torch.from_numpy(blocks)


def _shapes(fmt: str) -> list[int]:
    """K per type: whole chunks of 256 (a pair, a pair and one more: the per-32 scales run pairs of chunks as
    one segment), and for the 32-blocks short last chunks of 64 / 96 / 192 weights"""
    return [512, 768] if quant_ops.GGUF_TYPES[fmt][1] == 256 else [576, 352, 448, 832]


@pytest.mark.parametrize("fmt", TYPES)
def test_gemm_equals_the_integer_reference(isa, fmt):
    rng = np.random.default_rng(11)
    for K in _shapes(fmt):
        blocks, tb = _case(fmt, 37, K, seed=K)
        for M in (1, 5, 64):
            x = rng.normal(0, 1, (M, K)).astype(np.float32)
            out = quant_ops.gguf_kq_gemm(torch.from_numpy(x), tb, fmt, out_dtype=torch.float32)
            assert out.shape == (M, 37)
            ref, slack = _reference(x, blocks, fmt, K)
            err = np.abs(out.numpy() - ref)
            assert (err <= slack).all(), (fmt, K, M, float((err - slack).max()))


@pytest.mark.parametrize("fmt", TYPES)
def test_many_rows_within_activation_rounding_of_the_float_gemm(isa, fmt):
    """The float GEMM on the dequantized weights: |out - ref| <= sum_j dx_j / 2 |w_j| (plus float32 slack),
    and relative to the outputs the error stays below 2% in norm (bf16 x)."""
    K = _shapes(fmt)[0]
    blocks, tb = _case(fmt, 45, K, seed=3)
    w = dequantize(blocks, GGMLQuantizationType[fmt]).astype(np.float32)
    x = torch.from_numpy(np.random.default_rng(4).normal(0, 1, (133, K)).astype(np.float32)).to(torch.bfloat16)
    xf = x.float().numpy()
    ref = xf @ w.T
    out = quant_ops.gguf_kq_gemm(x, tb, fmt, out_dtype=torch.float32).numpy()
    qx = 256 if quant_ops.GGUF_TYPES[fmt][1] == 256 else 32
    dx = np.abs(xf.reshape(133, K // qx, qx)).max(-1) / 127.0
    bound = np.repeat(dx / 2, qx, axis=1) @ np.abs(w).T + 1e-5 * np.abs(xf) @ np.abs(w).T + 1e-6
    err = np.abs(out - ref)
    assert (err <= bound).all(), (fmt, float((err - bound).max()))
    assert float(np.linalg.norm(err)) < 0.02 * float(np.linalg.norm(ref)), fmt
    out_bf16 = quant_ops.gguf_kq_gemm(x, tb, fmt)
    assert out_bf16.dtype == torch.bfloat16
    assert torch.equal(out_bf16, torch.from_numpy(out).to(torch.bfloat16))  # the same float32 sums, rounded


@pytest.mark.parametrize("fmt", ["Q5_0", "Q4_K", "Q6_K", "Q8_0"])
def test_gemm_matches_the_decode_kernel_and_writes_columns(isa, fmt):
    """The decode kernel's sums (only the float32 order differs), and a slice of a wider output (a fused
    linear's columns) written in place, the other columns untouched."""
    K = _shapes(fmt)[0]
    _, tb = _case(fmt, 19, K, seed=6)
    x = torch.from_numpy(np.random.default_rng(7).normal(0, 1, (40, K)).astype(np.float32))
    many = quant_ops.gguf_kq_gemm(x, tb, fmt)
    rows = torch.cat([quant_ops.gguf_kq_gemv(x[i:i + 16], tb, fmt) for i in range(0, 40, 16)])
    torch.testing.assert_close(many, rows, rtol=1e-5, atol=1e-5)
    wide = torch.full((40, 50), 7.0)
    quant_ops.gguf_kq_gemm(x, tb, fmt, out=wide[:, 20:39])
    assert torch.equal(wide[:, 20:39], many)
    assert bool((wide[:, :20] == 7).all()) and bool((wide[:, 39:] == 7).all())


@pytest.mark.parametrize("fmt", list(quant_ops.Q8_TILE_FORMATS))
def test_tiles_gemm_equals_the_integer_reference_and_the_blocks_gemm(isa, fmt):
    """gguf_q8_tiles_gemm reads gemv_q8.c's tiles (the blocks moved; Q4_K's scales and Q6_K's quants unpacked)
    and quantizes the activations per block of 32 for every format: the reference's sums with q8_0, and for
    the 32-blocks the very floats of the GEMM on the file's blocks; a slice of a wider output written in place."""
    rng = np.random.default_rng(12)
    for K in _shapes(fmt) + ([1536] if fmt in ("Q4_K", "Q6_K") else []):
        blocks, tb = _case(fmt, 37, K, seed=K + 1)
        tiles = quant_ops.gguf_q8_tiles(tb, fmt)
        for M in (1, 5, 64):
            x = torch.from_numpy(rng.normal(0, 1, (M, K)).astype(np.float32))
            out = quant_ops.gguf_q8_tiles_gemm(x, tiles, fmt, 37, out_dtype=torch.float32)
            ref, slack = _reference(x.numpy(), blocks, fmt, K, qx_len=32)
            err = np.abs(out.numpy() - ref)
            assert (err <= slack).all(), (fmt, K, M, float((err - slack).max()))
            if quant_ops.GGUF_TYPES[fmt][1] == 32:
                assert torch.equal(out, quant_ops.gguf_kq_gemm(x, tb, fmt, out_dtype=torch.float32))
    wide = torch.full((64, 50), 7.0)
    quant_ops.gguf_q8_tiles_gemm(x, tiles, fmt, 37, out=wide[:, 5:42])
    assert torch.equal(wide[:, 5:42], out)
    assert bool((wide[:, :5] == 7).all()) and bool((wide[:, 42:] == 7).all())


@pytest.mark.skipif("avx512_vnni" not in detect().features or detect().isa not in ("avx512_bf16", "avx512"),
                    reason="no AVX512-VNNI")
def test_the_vnni_build_without_bf16(monkeypatch):
    """A CPU with AVX512-VNNI and no BF16 (Cascade Lake, Ice Lake; here BF16 masked): the library compiles the
    VNNI int8 paths, which give the integer reference's sums on the blocks and on the tiles."""
    import dataclasses

    from radixlang_kernels.cpu_caps import apply_mask, parse_mask
    from radixlang_kernels.op_table import build_library

    caps = detect()
    masked = caps.masked | parse_mask("avx512_bf16")
    caps = dataclasses.replace(caps, features=apply_mask(caps.features, masked), masked=masked)
    assert caps.isa == "avx512" and "-mavx512vnni" in caps.kernel_cflags()
    lib = build_library(caps)
    assert lib is not None
    cpu_ops.load()
    monkeypatch.setattr(cpu_ops, "_lib", lib)
    rng = np.random.default_rng(13)
    for fmt in ("Q5_0", "Q4_K", "Q6_K", "Q8_0"):
        K = _shapes(fmt)[0]
        blocks, tb = _case(fmt, 21, K, seed=5)
        x = torch.from_numpy(rng.normal(0, 1, (40, K)).astype(np.float32))
        for qx_len, out in ((0, quant_ops.gguf_kq_gemm(x, tb, fmt, out_dtype=torch.float32)),
                            (32, quant_ops.gguf_q8_tiles_gemm(x, quant_ops.gguf_q8_tiles(tb, fmt), fmt, 21,
                                                              out_dtype=torch.float32))):
            ref, slack = _reference(x.numpy(), blocks, fmt, K, qx_len=qx_len)
            assert (np.abs(out.numpy() - ref) <= slack).all(), (fmt, qx_len)


def test_tiles_gemm_refusals(isa):
    lib = cpu_ops.load() if cpu_ops._lib is None else cpu_ops._lib
    tiles = quant_ops.gguf_q8_tiles(_case("Q4_K", 8, 512, seed=1)[1], "Q4_K")
    x, out = torch.zeros(3, 512), torch.empty(3, 8)

    def call(fmt: int, K: int, ldo: int) -> int:
        return lib.gguf_q8_tiles_gemm(x.data_ptr(), 0, tiles.data_ptr(), fmt, out.data_ptr(), 0, 3, K, 8, ldo)
    assert call(3, 512, 8) == -1  # Q4_1's ggml number is 3: not a tiles format (its tiles say 2)
    assert call(12, 288, 8) == -1  # K % 256
    assert call(12, 512, 7) == -1  # ldo < N
    with pytest.raises(ValueError, match="cannot hold"):
        quant_ops.gguf_q8_tiles_gemm(x, tiles, "Q4_K", 8, out=torch.empty(3, 5))


def test_gemm_refusals(isa):
    _, tb = _case("Q4_K", 8, 512, seed=1)
    lib = cpu_ops.load() if cpu_ops._lib is None else cpu_ops._lib
    x, out = torch.zeros(3, 512), torch.empty(3, 8)
    assert lib.gguf_kq_gemm(x.data_ptr(), 0, tb.data_ptr(), 16, out.data_ptr(), 0, 3, 512, 8, 8) == -1  # IQ2_XXS
    assert lib.gguf_kq_gemm(x.data_ptr(), 0, tb.data_ptr(), 12, out.data_ptr(), 0, 3, 200, 8, 8) == -1  # K % 256
    assert lib.gguf_kq_gemm(x.data_ptr(), 0, tb.data_ptr(), 12, out.data_ptr(), 0, 3, 512, 8, 7) == -1  # ldo < N
    with pytest.raises(ValueError, match="cannot hold"):
        quant_ops.gguf_kq_gemm(x, tb, "Q4_K", out=torch.empty(3, 5))
    assert torch.equal(quant_ops.gguf_kq_gemm(x, tb, "Q4_K"), torch.zeros(3, 8))
