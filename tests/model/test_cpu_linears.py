"""The C linear kernels called directly (gemv.c, gemv_dense.c, gemv_q8.c and the modules on them), against
dequantize-then-matmul and float64 references, once per instruction set this machine has (the `isa`
fixture, conftest.py), in bf16 and float32. Skipped where no compiler exists."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixlang_kernels import cpu_ops, quant_ops
from radixlang_kernels.cpu_caps import detect

pytestmark = pytest.mark.skipif(detect().compiler is None, reason="no C compiler: torch fallback in use")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,K,N", [(1, 576, 96), (3, 40, 33), (16, 1536, 64), (2, 13, 5)])
def test_qlinear_int8_matches_dequantize_then_matmul(isa, dtype, M, K, N):
    from radixlang_runtime.model.layers.quant_linear import quantize_int8

    g = torch.Generator().manual_seed(5)
    w = torch.randn(N, K, generator=g)
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    assert float(((q.float() * scale[:, None]) - w).abs().max()) <= float(scale.max()) / 2 + 1e-6
    x = torch.randn(M, K, generator=g).to(dtype)
    want = x.float() @ (q.float() * scale[:, None]).T
    got = quant_ops.qlinear_int8(x, q, scale)
    assert got is not None and got.dtype == dtype and got.shape == (M, N)
    torch.testing.assert_close(got.float(), want, **(dict(rtol=1e-2, atol=2e-2) if dtype == torch.bfloat16
                                                      else dict(rtol=1e-5, atol=1e-4)))
    assert quant_ops.qlinear_int8(torch.randn(17, K).to(dtype), q, scale) is None  # above the kernel's M


def test_int8_linear_module_both_paths(isa):
    from radixlang_runtime.model.layers.quant_linear import Int8Linear

    g = torch.Generator().manual_seed(6)
    w, b = torch.randn(48, 64, generator=g), torch.randn(48, generator=g)
    lin = Int8Linear(w, b)
    ref = lambda x: x @ (lin.qweight.float() * lin.scale[:, None]).T + b  # noqa: E731
    for M in (1, 16, 17, 200):  # the C kernel, then the dequantize + GEMM path
        x = torch.randn(M, 64, generator=g)
        torch.testing.assert_close(lin(x), ref(x), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,K,N", [(1, 576, 96), (3, 40, 33), (16, 1536, 64), (5, 2, 31), (4, 13, 70)])
@pytest.mark.parametrize("bias", [False, True])
def test_dense_gemv_matches_matmul(isa, dtype, M, K, N, bias):
    """gemv_dense.c on its tiled copy (ragged last tile, odd K in float32, bias, strided rows, both
    bf16 bodies) against a float32 matmul of the same values."""
    if dtype == torch.bfloat16 and K % 2:
        with pytest.raises(ValueError, match="even K"):
            cpu_ops.dense_tiles(torch.zeros(N, K, dtype=dtype))
        return
    g = torch.Generator().manual_seed(8)
    w = torch.randn(N, K, generator=g).to(dtype)
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    x = torch.randn(M, 2 * K, generator=g).to(dtype)[:, ::2] if K > 2 else torch.randn(M, K, generator=g).to(dtype)
    tiles = cpu_ops.dense_tiles(w)
    assert tiles.shape[0] == -(-N // cpu_ops.DENSE_TILE)
    want = x.float() @ w.float().T + (b.float() if bias else 0)
    tol = dict(rtol=1e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-4)
    for portable in ([False, True] if dtype == torch.bfloat16 else [False]):
        got = cpu_ops.dense_gemv(x, tiles, N, b, portable=portable)
        assert got is not None and got.dtype == dtype and got.shape == (M, N)
        torch.testing.assert_close(got.float(), want, **tol)
    big = torch.randn(200, K, generator=g).to(dtype)
    got = cpu_ops.dense_gemv(big, tiles, N, b)
    if cpu_ops.dense_any_m(dtype):  # the GEMM micro-kernel, any M, the same sums per row
        assert isa == "avx512_bf16" or (isa == "avx512" and dtype == torch.float32)
        assert got is not None
        torch.testing.assert_close(got.float(), big.float() @ w.float().T + (b.float() if bias else 0), **tol)
        assert torch.equal(got[3:4], cpu_ops.dense_gemv(big[3:4], tiles, N, b))  # batch-invariant rows
    else:
        assert got is None  # above the kernel's M: the caller's GEMM runs


def test_packed_linear_with_tiles_both_paths(isa):
    """PackedLinear with dense tiles: decode-sized batches run the tiles, larger ones oneDNN unless the tiles
    take any M (float32 on AVX-512 builds, bf16 on VDPBF16PS ones: then no oneDNN copy); same values."""
    from radixlang_runtime.model.layers.packed_linear import PackedLinear, packing_available

    if not packing_available(torch.device("cpu"), torch.float32):
        pytest.skip("oneDNN prepacking unavailable")
    g = torch.Generator().manual_seed(9)
    w, b = torch.randn(48, 64, generator=g), torch.randn(48, generator=g)
    lin = PackedLinear(w, b, tiles=True)
    assert lin.tiles is not None and lin.any_m == isa.startswith("avx512") and (lin.packed is None) == lin.any_m
    for M in (1, 16, 17, 200):
        x = torch.randn(M, 64, generator=g)
        torch.testing.assert_close(lin(x), x @ w.T + b, rtol=1e-5, atol=1e-4)
    if packing_available(torch.device("cpu"), torch.bfloat16):
        wb, bb = w.bfloat16(), b.bfloat16()
        lin = PackedLinear(wb, bb, tiles=True)
        assert lin.any_m == (isa == "avx512_bf16") and (lin.packed is None) == lin.any_m
        for M in (1, 16, 17, 200):
            x = torch.randn(M, 64, generator=g).bfloat16()
            torch.testing.assert_close(lin(x).float(), x.float() @ wb.float().T + bb.float(), rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,K,N", [(1, 576, 96), (3, 64, 33), (16, 1536, 7), (5, 32, 4)])
def test_gguf_gemv_matches_dequantize_then_matmul(isa, fmt, dtype, M, K, N):
    """GGUF blocks as the gguf package writes them, against its own dequantize."""
    import gguf.quants as gq

    kind = getattr(gq.GGMLQuantizationType, fmt)
    g = torch.Generator().manual_seed(7)
    blocks = gq.quantize(torch.randn(N, K, generator=g).numpy(), kind)  # [N, K / 32 * bytes] uint8
    w = torch.from_numpy(gq.dequantize(blocks, kind).copy())
    x = torch.randn(M, K, generator=g).to(dtype)
    want = x.float() @ w.T
    got = quant_ops.gguf_gemv(x, torch.from_numpy(blocks), fmt)
    assert got is not None and got.dtype == dtype and got.shape == (M, N)
    torch.testing.assert_close(got.float(), want, **(dict(rtol=1e-2, atol=3e-2) if dtype == torch.bfloat16
                                                      else dict(rtol=1e-5, atol=1e-4)))
    assert quant_ops.gguf_gemv(torch.randn(17, K).to(dtype), torch.from_numpy(blocks), fmt) is None


def _q8_reference(x: torch.Tensor, blocks, fmt: str):
    """gemv_q8.c's arithmetic in float64 numpy: x quantized per block of 32 (dx = max|x| / 127 in float32,
    qx = x * (127 / max|x|) rounded to nearest even), integer block dots with the weights' quants, scaled.
    blocks: GGUF rows (fmt Q4_1 / Q5_0 / Q8_0 / Q4_K), or (q [N, K] int8, scale [N]) for fmt "int8".
    Returns (that, exact dequantize-then-matmul, the bound sum_b dx_b / 2 sum_j |w_j|), all [M, N]."""
    import gguf.quants as gq
    M, K = x.shape
    nb = K // 32
    xb = x.float().numpy().reshape(M, nb, 32)
    amax = np.abs(xb).max(-1)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    qx = np.rint(xb * inv[..., None]).astype(np.int64)
    dx = (amax / np.float32(127)).astype(np.float64)
    mw = 0.0
    if fmt == "int8":
        q, scale = (t.numpy() for t in blocks)
        N = q.shape[0]
        qw = q.reshape(N, nb, 32).astype(np.int64)
        dw = np.repeat(scale.astype(np.float64)[:, None], nb, 1)
        w = q.astype(np.float64) * scale.astype(np.float64)[:, None]
    elif fmt == "Q6_K":  # q - 32 with a scale d sc per 16 weights: the dots summed per 16
        N = blocks.shape[0]
        b = blocks.reshape(N, nb // 8, 210)
        d = b[..., 208:210].copy().view(np.float16)[..., 0].astype(np.float64)[..., None]
        sc = b[..., 192:208].copy().view(np.int8).astype(np.float64)
        q = []
        for h in range(2):
            lo, hi = b[..., 64 * h:64 * h + 64].astype(np.int64), b[..., 128 + 32 * h:160 + 32 * h].astype(np.int64)
            runs = [lo[..., :32] & 15, lo[..., 32:] & 15, lo[..., :32] >> 4, lo[..., 32:] >> 4]
            q += [runs[k] | (((hi >> (2 * k)) & 3) << 4) for k in range(4)]
        qw = (np.concatenate(q, -1) - 32).reshape(N, nb * 2, 16)
        dw = (d * sc).reshape(N, nb * 2)
        w = gq.dequantize(blocks, gq.GGMLQuantizationType.Q6_K).astype(np.float64)
        assert np.array_equal((qw * dw[..., None]).reshape(N, K), w)  # the reference's unpacking is the file's
        want = (np.einsum("mgj,ngj->mng", qx.reshape(M, nb * 2, 16), qw) * dw[None]
                * np.repeat(dx, 2, -1)[:, None]).sum(-1)
        bound = (dx[:, None, :] / 2 * np.abs(w.reshape(N, nb, 32)).sum(-1)[None]).sum(-1)
        return want, x.double().numpy() @ w.T, bound
    elif fmt == "Q4_K":  # per sub-block of 32: dw = d sc, mw = -dmin m, the group's low / high nibbles
        N = blocks.shape[0]
        b = blocks.reshape(N, nb // 8, 144)
        d, dmin = (b[..., i:i + 2].copy().view(np.float16)[..., 0].astype(np.float64)[..., None] for i in (0, 2))
        q = b[..., 4:16].astype(np.int64)
        sc = np.concatenate([q[..., :4] & 63, (q[..., 8:] & 15) | ((q[..., :4] >> 6) << 4)], -1)
        mn = np.concatenate([q[..., 4:8] & 63, (q[..., 8:] >> 4) | ((q[..., 4:8] >> 6) << 4)], -1)
        dw, mw = (d * sc).reshape(N, nb), (-(dmin * mn)).reshape(N, nb)[None]
        qs = b[..., 16:].reshape(N, nb // 8, 4, 1, 32).astype(np.int64)
        qw = np.concatenate([qs & 15, qs >> 4], -2).reshape(N, nb, 32)
        w = gq.dequantize(blocks, gq.GGMLQuantizationType.Q4_K).astype(np.float64)
    else:
        N = blocks.shape[0]
        b = blocks.reshape(N, nb, -1)
        dw = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float64)
        if fmt == "Q8_0":
            qw = b[..., 2:].view(np.int8).astype(np.int64)
        elif fmt == "Q5_0":  # qw = nibble | fifth bit << 4 in 0 .. 31, w = dw (qw - 16): mw = -16 dw
            qs, qh = b[..., 6:], b[..., 2:6].copy().view(np.uint32).astype(np.int64)
            bits = (qh >> np.arange(32)) & 1
            qw = np.concatenate([qs & 15, qs >> 4], -1).astype(np.int64) | (bits << 4)
            mw = -16 * dw[None]
        else:
            qs = b[..., 4:]
            qw = np.concatenate([qs & 15, qs >> 4], -1).astype(np.int64)
            mw = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)[None]
        w = gq.dequantize(blocks, getattr(gq.GGMLQuantizationType, fmt)).astype(np.float64)
    sx = xb.astype(np.float64).sum(-1)[:, None]  # [M, 1, nb]
    want = (np.einsum("mbj,nbj->mnb", qx, qw) * dw[None] * dx[:, None] + mw * sx).sum(-1)
    exact = x.double().numpy() @ w.T
    bound = (dx[:, None, :] / 2 * np.abs(w.reshape(N, nb, 32)).sum(-1)[None]).sum(-1)
    return want, exact, bound


def _assert_q8(got: torch.Tensor, want, exact, bound) -> None:
    scale = np.abs(want).max()
    assert np.abs(got.double().numpy() - want).max() <= 2e-6 * scale
    assert (np.abs(got.double().numpy() - exact) <= bound * 1.001 + 1e-6 * scale).all()


@pytest.mark.parametrize("fmt", ["Q4_1", "Q5_0", "Q8_0"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,K,N", [(1, 576, 96), (3, 96, 33), (16, 1536, 7), (5, 32, 4), (7, 64, 1)])
def test_gguf_q8_gemv_is_exact_on_quantized_activations(isa, fmt, dtype, M, K, N):
    """gemv_q8.c on gguf_q8_tiles: equal (to float32 rounding) to the integer dots of the int8 activations
    with the blocks' quants, scaled (every ISA computes the same integers), and within the activations'
    rounding bound of dequantize-then-matmul; odd block counts and N % 4 != 0 take the padding."""
    import gguf.quants as gq

    g = torch.Generator().manual_seed(11)
    blocks = gq.quantize(torch.randn(N, K, generator=g).numpy(), getattr(gq.GGMLQuantizationType, fmt))
    x = torch.randn(M, K, generator=g).to(dtype)
    x[0, :32] = 0.0  # an all-zero block: dx = 0
    tiles = quant_ops.gguf_q8_tiles(torch.from_numpy(blocks), fmt)
    assert tiles.shape == (-(-N // 4), -(-K // 64), {"Q8_0": 272, "Q4_1": 160, "Q5_0": 176}[fmt])
    got = quant_ops.gguf_q8_gemv(x, tiles, fmt, N, torch.float32)
    _assert_q8(got, *_q8_reference(x, blocks, fmt))
    out = quant_ops.gguf_q8_gemv(x, tiles, fmt, N)  # stored like x
    assert out.dtype == dtype and torch.equal(out, got.to(dtype))
    assert quant_ops.gguf_q8_gemv(torch.randn(17, K).to(dtype), tiles, fmt, N) is None


@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,K,N", [(1, 1536, 96), (3, 256, 33), (16, 512, 7)])
def test_gguf_q8_gemv_k_quant_tiles_are_exact_on_quantized_activations(isa, fmt, dtype, M, K, N):
    """K-quants on gemv_q8.c's tiles (Q4_K: d sc and -dmin m per 32 weights; Q6_K: q - 32 with d sc per 16;
    exact in float32): the same checks as the 32-weight formats; the tiles give the file's blocks back."""
    from radixlang_kernels.testing import random_gguf_blocks

    blocks = random_gguf_blocks(fmt, N, K, 0.05, np.random.default_rng(13))
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(13)).to(dtype)
    tiles = quant_ops.gguf_q8_tiles(torch.from_numpy(blocks), fmt)
    assert tiles.shape == (-(-N // 4), K // 64, 160 if fmt == "Q4_K" else 280)
    assert np.array_equal(quant_ops.gguf_q8_untiles(tiles, fmt, N, K).numpy(), blocks)
    got = quant_ops.gguf_q8_gemv(x, tiles, fmt, N, torch.float32)
    _assert_q8(got, *_q8_reference(x, blocks, fmt))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,K,N", [(1, 576, 96), (3, 96, 33), (16, 1536, 7), (5, 32, 4)])
def test_int8_q8_gemv_is_exact_on_quantized_activations(isa, dtype, M, K, N):
    """The INT8 tiles (--quantization int8 on bf16 models): the same checks as the GGUF formats, with one
    float32 scale per row."""
    from radixlang_runtime.model.layers.quant_linear import quantize_int8

    g = torch.Generator().manual_seed(12)
    q, scale = quantize_int8(torch.randn(N, K, generator=g))
    x = torch.randn(M, K, generator=g).to(dtype)
    tiles = quant_ops.int8_q8_tiles(q)
    assert tiles.shape == (-(-N // 4), -(-K // 64), 256)
    got = quant_ops.int8_q8_gemv(x, tiles, scale, torch.float32)
    _assert_q8(got, *_q8_reference(x, (q, scale), "int8"))
    assert torch.equal(quant_ops.int8_q8_gemv(x, tiles, scale), got.to(dtype))


def test_gguf_q8_gemv_extreme_quants(isa):
    """Q8_0 quants of -128 (a file may hold them; the AVX512BW / AVX2 paths take |qw| = 128) against
    activations at +-max (127: dx = 1, so every float step is exact too): the integer dots stay exact
    (no 16-bit saturation)."""
    K, N = 128, 5
    d = np.frombuffer(np.float16(0.5).tobytes(), dtype=np.uint8)
    blocks = np.zeros((N, K // 32, 34), dtype=np.uint8)
    blocks[..., :2] = d
    blocks[..., 2:] = np.array([-128, 127] * 16, dtype=np.int8).view(np.uint8)
    blocks[1, :, 2:] = np.array(-128, dtype=np.int8).view(np.uint8)
    blocks = blocks.reshape(N, -1)
    x = torch.tensor([[-127.0, 127.0] * (K // 2), [127.0] * K, [-127.0] * K], dtype=torch.float32)
    got = quant_ops.gguf_q8_gemv(x, quant_ops.gguf_q8_tiles(torch.from_numpy(blocks), "Q8_0"), "Q8_0", N)
    want, _, _ = _q8_reference(x, blocks, "Q8_0")
    assert np.array_equal(got.double().numpy(), want)
