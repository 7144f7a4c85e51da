"""gemv_kquant.c and gguf_dequant.c on every GGUF block type, against gguf.quants (numpy) as the reference,
once per instruction set this machine has (the `isa` fixture: AVX512-VNNI, AVX512BW, AVX2, plain C).

The int8-activation matvec is bounded the way llama.cpp's test-quantize-fns bounds vec_dot, but tighter:
against dequantize-then-matmul its only error is the activations' rounding, |x - dx qx| <= dx / 2 per
element (dx = max|x| / 127 of the element's q8_K / q8_0 block), so |out - ref| <= sum_j dx_j / 2 |w_j|
(plus float32 summation slack); the dequantizer gives gguf.quants' float32 values bit for bit."""

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


def _case(fmt: str, N: int, seed: int = 0):
    _, qk, _ = quant_ops.GGUF_TYPES[fmt]
    K = 512 if qk == 256 else 352  # two chunks of 256 / eleven blocks of 32 (a short last chunk)
    blocks = random_gguf_blocks(fmt, N, K, 0.05, np.random.default_rng(seed))
    w = dequantize(blocks, GGMLQuantizationType[fmt]).astype(np.float32)  # [N, K]
    return torch.from_numpy(blocks), w, K, qk


def _bound(x: np.ndarray, w: np.ndarray, qk: int) -> np.ndarray:
    """[M, N]: sum_j dx_j / 2 |w_nj| for activations x [M, K] quantized per block of qx."""
    qx = 256 if qk == 256 else 32
    M, K = x.shape
    dx = np.abs(x.reshape(M, K // qx, qx)).max(-1) / 127.0  # [M, K / qx]
    half = np.repeat(dx / 2, qx, axis=1)  # [M, K]
    slack = 1e-5 * np.abs(x) @ np.abs(w).T
    return half @ np.abs(w).T + slack + 1e-6


@pytest.mark.parametrize("fmt", TYPES)
def test_kq_gemv_within_activation_rounding(isa, fmt):
    blocks, w, K, qk = _case(fmt, N=37)
    rng = np.random.default_rng(1)
    for M in (1, 3, 16):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.from_numpy(rng.normal(0, 1, (M, K)).astype(np.float32)).to(dtype)
            xf = x.float().numpy()
            ref = xf @ w.T
            out = quant_ops.gguf_kq_gemv(x, blocks, fmt, out_dtype=torch.float32)
            assert out is not None and out.shape == (M, 37)
            err = np.abs(out.numpy() - ref)
            assert (err <= _bound(xf, w, qk)).all(), (fmt, M, dtype, float(err.max()))
            # llama.cpp's own yardstick (test-quantize-fns: |dot - ref| / K below 0.02)
            assert float(err.max()) / K < 0.02
            assert float(np.abs(ref).max()) > 10 * float(err.max())  # the check has teeth
            out_bf16 = quant_ops.gguf_kq_gemv(x, blocks, fmt)
            assert out_bf16.dtype == dtype
            torch.testing.assert_close(out_bf16.float(), out.to(dtype).float(), rtol=0, atol=0)


@pytest.mark.parametrize("fmt", TYPES)
def test_exact_gemv_sums_the_dequantized_values(isa, fmt):
    """gguf_dequant_gemv: float32 sums over gguf.quants' values (only the summation order differs)."""
    blocks, w, K, _ = _case(fmt, N=37, seed=4)
    rng = np.random.default_rng(5)
    for M in (1, 5):
        x = rng.normal(0, 1, (M, K)).astype(np.float32)
        out = quant_ops.gguf_kq_gemv(torch.from_numpy(x), blocks, fmt, exact=True)
        ref = (x.astype(np.float64) @ w.T.astype(np.float64))
        slack = 1e-6 * (np.abs(x) @ np.abs(w).T) + 1e-7  # float32 rounding of K products and sums
        assert (np.abs(out.numpy() - ref) <= slack).all(), fmt


@pytest.mark.parametrize("fmt", TYPES)
def test_dequant_rows_bitwise_equal_to_gguf(isa, fmt):
    blocks, w, K, _ = _case(fmt, N=21, seed=2)
    full = quant_ops.gguf_dequant_rows(blocks, fmt, K, torch.float32)
    assert np.array_equal(full.numpy(), w)
    rows = torch.tensor([20, 0, 7, 7], dtype=torch.int64)
    picked = quant_ops.gguf_dequant_rows(blocks, fmt, K, torch.bfloat16, rows=rows)
    torch.testing.assert_close(picked, torch.from_numpy(w)[rows].to(torch.bfloat16), rtol=0, atol=0)
    tile = quant_ops.gguf_dequant_rows(blocks, fmt, K, torch.float32, row0=5, n_rows=9)
    assert np.array_equal(tile.numpy(), w[5:14])


@pytest.mark.parametrize("fmt", ["Q5_0", "Q4_K", "Q6_K", "Q8_0"])
def test_many_rows_equal_one_row_at_a_time(isa, fmt):
    """A batch above 16 rows (one unpacked chunk for all of them) gives each row the bits it gets alone, on both
    kernels; the wrapper takes the exact one up to KQ_EXACT_MAX_M rows."""
    blocks, _, K, _ = _case(fmt, N=19, seed=6)
    lib = cpu_ops.load() if cpu_ops._lib is None else cpu_ops._lib
    x = torch.from_numpy(np.random.default_rng(7).normal(0, 1, (40, K)).astype(np.float32))
    for name in ("gguf_kq_gemv", "gguf_dequant_gemv"):
        def call(rows):
            out = torch.empty(rows.shape[0], 19)
            rc = getattr(lib, name)(rows.data_ptr(), 0, blocks.data_ptr(), quant_ops.GGUF_TYPES[fmt][0],
                                    out.data_ptr(), 0, rows.shape[0], K, 19)
            assert rc == 0, (name, rc)
            return out
        many = call(x)
        for m in (0, 17, 39):
            assert torch.equal(many[m:m + 1], call(x[m:m + 1].contiguous())), (name, m)
    assert torch.equal(quant_ops.gguf_kq_gemv(x, blocks, fmt, exact=True), call(x))
    assert quant_ops.gguf_kq_gemv(torch.zeros(quant_ops.KQ_EXACT_MAX_M + 1, K), blocks, fmt, exact=True) is None


def test_kq_gemv_limits(isa):
    blocks, _, K, _ = _case("Q4_K", N=8)
    assert quant_ops.gguf_kq_gemv(torch.zeros(quant_ops.KQ_MAX_M + 1, K), blocks, "Q4_K") is None
    lib = cpu_ops.load() if cpu_ops._lib is None else cpu_ops._lib
    out = torch.empty(1, 8)
    x = torch.zeros(1, K)
    assert lib.gguf_kq_gemv(x.data_ptr(), 0, blocks.data_ptr(), 16, out.data_ptr(), 0, 1, K, 8) == -1  # IQ2_XXS
    assert lib.gguf_kq_gemv(x.data_ptr(), 0, blocks.data_ptr(), 12, out.data_ptr(), 0, 1, 200, 8) == -1  # K % 256
    assert lib.gguf_kq_gemv(x.data_ptr(), 0, blocks.data_ptr(), 12, out.data_ptr(), 0, 257, K, 8) == -1  # rows
    zero = quant_ops.gguf_kq_gemv(x, blocks, "Q4_K")
    assert torch.equal(zero, torch.zeros(1, 8))
