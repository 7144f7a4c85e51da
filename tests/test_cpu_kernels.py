"""The C kernels called directly, against plain torch math and kernels/reference.py, once per
instruction set this machine has (AVX512-BF16 / AVX-512 / AVX2 / plain x86-64 builds of the same
sources, selected by masking features), in bf16 and float32. Skipped where no compiler exists."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from kernels.reference import paged_attention_ref
from radixlang_runtime.model import cpu_kernels
from radixlang_runtime.model.cpu_caps import apply_mask, detect, parse_mask

pytestmark = pytest.mark.skipif(detect().compiler is None, reason="no C compiler: torch fallback in use")

_MASKS = {"avx512_bf16": "", "avx512": "avx512_bf16", "avx2": "avx512", "scalar": "avx2"}


def _isas() -> list[str]:
    caps = detect()
    if caps.arch not in ("x86_64", "AMD64"):
        return [caps.isa]
    order = ["avx512_bf16", "avx512", "avx2", "scalar"]
    return order[order.index(caps.isa):]  # the machine's own and every weaker one


@pytest.fixture(params=_isas())
def isa(request, monkeypatch):
    """Installs the library built for one instruction set as cpu_kernels' library for the test."""
    caps = detect()
    masked = caps.masked | parse_mask(_MASKS[request.param])
    caps = dataclasses.replace(caps, features=apply_mask(caps.features, masked), masked=masked)
    assert caps.isa == request.param
    lib = cpu_kernels.build_library(caps)
    assert lib is not None, "the kernels must build for every instruction set of this CPU"
    # load the process's own library first: a load() inside the test (a module's constructor) must not
    # leave "tried" set with the patched library restored to None afterwards
    cpu_kernels.load()
    monkeypatch.setattr(cpu_kernels, "_lib", lib)
    return request.param


def _tol(dtype):
    return dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_add_rms_norm_and_silu_mul(isa, dtype):
    g = torch.Generator().manual_seed(0)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    for T, H in [(7, 576), (3, 13), (2, 40)]:
        r = torch.randn(T, H, generator=g).to(dtype)
        x = torch.randn(T, H, generator=g).to(dtype)
        w = torch.randn(H, generator=g).to(dtype)
        want_r = r + x
        want = F.rms_norm(want_r.float(), (H,), w.float(), 1e-5)
        got = cpu_kernels.add_rms_norm(x, r, w, 1e-5)
        assert got.dtype == dtype
        assert torch.equal(r, want_r)  # the residual is updated in place, rounded like torch's add
        torch.testing.assert_close(got.float(), want, **tol)
        torch.testing.assert_close(cpu_kernels.add_rms_norm(None, r, w, 1e-5).float(), want, **tol)
        gu = 4 * torch.randn(T, 2 * H, generator=g).to(dtype)
        want = F.silu(gu[:, :H].float()) * gu[:, H:].float()
        torch.testing.assert_close(cpu_kernels.silu_mul(gu).float(), want, **tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("lens", [[7, 7, 7], [5, 1, 40, 17], [300]])
@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (8, 2, 128), (6, 3, 13)])
def test_extend_causal_matches_sdpa(isa, dtype, lens, H, hkv, D):
    g = torch.Generator().manual_seed(1)
    T = sum(lens)
    qkv = torch.randn(T, H + 2 * hkv, D, generator=g).to(dtype)  # strided views, as the model passes
    q, k, v = qkv[:, :H], qkv[:, H : H + hkv], qkv[:, H + hkv :]
    starts = torch.tensor([sum(lens[:i]) for i in range(len(lens))])
    for dp in {False, isa == "avx512_bf16" and dtype == torch.bfloat16 and D % 32 == 0}:
        got = cpu_kernels.extend_causal(q, k, v, starts, torch.tensor(lens), D ** -0.5, dpbf16=dp)
        for s, n in zip(starts.tolist(), lens):
            want = F.scaled_dot_product_attention(
                q[s : s + n].float().transpose(0, 1), k[s : s + n].float().transpose(0, 1),
                v[s : s + n].float().transpose(0, 1), is_causal=True, enable_gqa=True).transpose(0, 1)
            torch.testing.assert_close(got[s : s + n].view(n, H, D).float(), want, **_tol(dtype))


def _scattered_pool(g, hkv, D, dtype, page_size, rows, lens, num_slots=1024):
    """K/V pools of random (stale) data and a req_to_token whose requests own shuffled whole pages."""
    kb = torch.randn(hkv, num_slots, D, generator=g).to(dtype)
    vb = torch.randn(hkv, num_slots, D, generator=g).to(dtype)
    rt = torch.zeros(max(rows) + 1, 512, dtype=torch.int64)
    pages = torch.randperm(num_slots // page_size, generator=g).tolist()
    for row, n in zip(rows, lens):
        mine = [pages.pop() for _ in range(-(-n // page_size))]
        rt[row, :n] = torch.tensor([mine[i // page_size] * page_size + i % page_size for i in range(n)])
    return kb, vb, rt


def _new_tokens(g, H, hkv, D, dtype, kb, vb, rt, rows, prefix_lens, extend_lens):
    """q, k, v of the new tokens (strided views of one qkv tensor, as the model passes), their K/V
    stored in the pool first at positions prefix_lens[i] .. of each row, as the model does."""
    qkv = torch.randn(sum(extend_lens), H + 2 * hkv, D, generator=g).to(dtype)
    q, k, v = qkv[:, :H], qkv[:, H : H + hkv], qkv[:, H + hkv :]
    start = 0
    for row, p, n in zip(rows, prefix_lens, extend_lens):
        kb[:, rt[row, p : p + n]] = k[start : start + n].transpose(0, 1)
        vb[:, rt[row, p : p + n]] = v[start : start + n].transpose(0, 1)
        start += n
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (8, 2, 128), (6, 3, 13)])
def test_extend_with_paged_prefix_matches_reference(isa, dtype, page_size, H, hkv, D):
    """Prefixes read in place through req_to_token (scattered slots), new tokens from q/k/v."""
    g = torch.Generator().manual_seed(2)
    prefix_lens, extend_lens, rows = [0, 33, 1, 200, 16], [5, 1, 40, 17, 16], [3, 0, 4, 1, 2]
    kb, vb, rt = _scattered_pool(g, hkv, D, dtype, page_size, rows, [p + n for p, n in zip(prefix_lens, extend_lens)])
    T = sum(extend_lens)
    q, k, v = _new_tokens(g, H, hkv, D, dtype, kb, vb, rt, rows, prefix_lens, extend_lens)
    starts = torch.tensor([sum(extend_lens[:i]) for i in range(5)])
    prefix = cpu_kernels.PagedPrefix(kb, vb, rt, torch.tensor(rows), torch.tensor(prefix_lens))
    want = paged_attention_ref(q, kb, vb, rt, rows, prefix_lens, extend_lens, D ** -0.5)
    for dp in {False, isa == "avx512_bf16" and dtype == torch.bfloat16 and D % 32 == 0}:
        got = cpu_kernels.extend_causal(q, k, v, starts, torch.tensor(extend_lens), D ** -0.5, prefix, dpbf16=dp)
        torch.testing.assert_close(got.view(T, H, D).float(), want, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("page_size", [1, 16])
# (16, 1, 32), (10, 2, 64), (4, 2, 48): the PV pass's query-head blocks of 8 / 4 + 1 / the generic
# width; seq_lens cover the score pass's partial blocks of 16 (1, 5) and whole ones (16, 200 = 12.5)
@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (8, 2, 128), (6, 3, 13), (16, 1, 32), (10, 2, 64), (4, 2, 48)])
def test_paged_decode_matches_reference(isa, dtype, page_size, H, hkv, D):
    g = torch.Generator().manual_seed(3)
    seq_lens, rows = [1, 37, 200, 16, 5], [2, 0, 4, 1, 3]
    kb, vb, rt = _scattered_pool(g, hkv, D, dtype, page_size, rows, seq_lens)
    q = torch.randn(len(rows), H, D, generator=g).to(dtype)
    got = cpu_kernels.paged_decode(q, kb, vb, rt, torch.tensor(rows), torch.tensor(seq_lens), D ** -0.5)
    want = paged_attention_ref(q, kb, vb, rt, rows, [s - 1 for s in seq_lens], [1] * len(rows), D ** -0.5)
    torch.testing.assert_close(got.float(), want, **_tol(dtype))


def test_plan_never_chooses_a_kernel_outside_its_limits():
    cpu = torch.device("cpu")
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        for D, H, hkv in [(64, 9, 3), (13, 6, 3), (512, 4, 4), (64, 66, 2)]:
            p = cpu_kernels.plan(cpu, dtype, D, H, hkv, packed_linears=False)
            kernel_ok = cpu_kernels.load() is not None and dtype != torch.float16 and D <= 256 and H // hkv <= 32
            assert p.c_decode == kernel_ok and p.c_extend == kernel_ok
            assert ("+dpbf16" in p.extend_attention) == (kernel_ok and detect().isa == "avx512_bf16"
                                                         and dtype == torch.bfloat16 and D % 32 == 0)
            assert p.c_norm_act == kernel_ok  # bf16 and float32 entry points


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,K,N", [(1, 576, 96), (3, 40, 33), (16, 1536, 64), (2, 13, 5)])
def test_qlinear_int8_matches_dequantize_then_matmul(isa, dtype, M, K, N):
    from radixlang_runtime.model.quant_linear import quantize_int8

    g = torch.Generator().manual_seed(5)
    w = torch.randn(N, K, generator=g)
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    assert float(((q.float() * scale[:, None]) - w).abs().max()) <= float(scale.max()) / 2 + 1e-6
    x = torch.randn(M, K, generator=g).to(dtype)
    want = x.float() @ (q.float() * scale[:, None]).T
    got = cpu_kernels.qlinear_int8(x, q, scale)
    assert got is not None and got.dtype == dtype and got.shape == (M, N)
    torch.testing.assert_close(got.float(), want, **(dict(rtol=1e-2, atol=2e-2) if dtype == torch.bfloat16
                                                      else dict(rtol=1e-5, atol=1e-4)))
    assert cpu_kernels.qlinear_int8(torch.randn(17, K).to(dtype), q, scale) is None  # above the kernel's M


def test_int8_linear_module_both_paths(isa):
    from radixlang_runtime.model.quant_linear import Int8Linear

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
            cpu_kernels.dense_tiles(torch.zeros(N, K, dtype=dtype))
        return
    g = torch.Generator().manual_seed(8)
    w = torch.randn(N, K, generator=g).to(dtype)
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    x = torch.randn(M, 2 * K, generator=g).to(dtype)[:, ::2] if K > 2 else torch.randn(M, K, generator=g).to(dtype)
    tiles = cpu_kernels.dense_tiles(w)
    assert tiles.shape[0] == -(-N // cpu_kernels.DENSE_TILE)
    want = x.float() @ w.float().T + (b.float() if bias else 0)
    tol = dict(rtol=1e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-4)
    for portable in ([False, True] if dtype == torch.bfloat16 else [False]):
        got = cpu_kernels.dense_gemv(x, tiles, N, b, portable=portable)
        assert got is not None and got.dtype == dtype and got.shape == (M, N)
        torch.testing.assert_close(got.float(), want, **tol)
    big = torch.randn(200, K, generator=g).to(dtype)
    got = cpu_kernels.dense_gemv(big, tiles, N, b)
    if cpu_kernels.dense_any_m(dtype):  # the GEMM micro-kernel, any M, the same sums per row
        assert isa == "avx512_bf16" or (isa == "avx512" and dtype == torch.float32)
        assert got is not None
        torch.testing.assert_close(got.float(), big.float() @ w.float().T + (b.float() if bias else 0), **tol)
        assert torch.equal(got[3:4], cpu_kernels.dense_gemv(big[3:4], tiles, N, b))  # batch-invariant rows
    else:
        assert got is None  # above the kernel's M: the caller's GEMM runs


def test_packed_linear_with_tiles_both_paths(isa):
    """PackedLinear with dense tiles: decode-sized batches run the tiles, larger ones oneDNN unless the tiles
    take any M (float32 on AVX-512 builds, bf16 on VDPBF16PS ones: then no oneDNN copy); same values."""
    from radixlang_runtime.model.packed_linear import PackedLinear, packing_available

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
    got = cpu_kernels.gguf_gemv(x, torch.from_numpy(blocks), fmt)
    assert got is not None and got.dtype == dtype and got.shape == (M, N)
    torch.testing.assert_close(got.float(), want, **(dict(rtol=1e-2, atol=3e-2) if dtype == torch.bfloat16
                                                      else dict(rtol=1e-5, atol=1e-4)))
    assert cpu_kernels.gguf_gemv(torch.randn(17, K).to(dtype), torch.from_numpy(blocks), fmt) is None


def _q8_reference(x: torch.Tensor, blocks, fmt: str):
    """gemv_q8.c's arithmetic in float64 numpy: x quantized per block of 32 (dx = max|x| / 127 in float32,
    qx = x * (127 / max|x|) rounded to nearest even), integer block dots with the weights' quants, scaled.
    blocks: GGUF rows (fmt Q4_1 / Q8_0), or (q [N, K] int8, scale [N]) for fmt "int8".
    Returns (that, exact dequantize-then-matmul, the bound sum_b dx_b / 2 sum_j |w_j|), all [M, N]."""
    import gguf.quants as gq
    import numpy as np

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
    else:
        N = blocks.shape[0]
        b = blocks.reshape(N, nb, -1)
        dw = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float64)
        if fmt == "Q8_0":
            qw = b[..., 2:].view(np.int8).astype(np.int64)
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
    import numpy as np

    scale = np.abs(want).max()
    assert np.abs(got.double().numpy() - want).max() <= 2e-6 * scale
    assert (np.abs(got.double().numpy() - exact) <= bound * 1.001 + 1e-6 * scale).all()


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
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
    tiles = cpu_kernels.gguf_q8_tiles(torch.from_numpy(blocks), fmt)
    assert tiles.shape == (-(-N // 4), -(-K // 64), 272 if fmt == "Q8_0" else 160)
    got = cpu_kernels.gguf_q8_gemv(x, tiles, fmt, N, torch.float32)
    _assert_q8(got, *_q8_reference(x, blocks, fmt))
    out = cpu_kernels.gguf_q8_gemv(x, tiles, fmt, N)  # stored like x
    assert out.dtype == dtype and torch.equal(out, got.to(dtype))
    assert cpu_kernels.gguf_q8_gemv(torch.randn(17, K).to(dtype), tiles, fmt, N) is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,K,N", [(1, 576, 96), (3, 96, 33), (16, 1536, 7), (5, 32, 4)])
def test_int8_q8_gemv_is_exact_on_quantized_activations(isa, dtype, M, K, N):
    """The INT8 tiles (--quantization int8 on bf16 models): the same checks as the GGUF formats, with one
    float32 scale per row."""
    from radixlang_runtime.model.quant_linear import quantize_int8

    g = torch.Generator().manual_seed(12)
    q, scale = quantize_int8(torch.randn(N, K, generator=g))
    x = torch.randn(M, K, generator=g).to(dtype)
    tiles = cpu_kernels.int8_q8_tiles(q)
    assert tiles.shape == (-(-N // 4), -(-K // 64), 256)
    got = cpu_kernels.int8_q8_gemv(x, tiles, scale, torch.float32)
    _assert_q8(got, *_q8_reference(x, (q, scale), "int8"))
    assert torch.equal(cpu_kernels.int8_q8_gemv(x, tiles, scale), got.to(dtype))


def test_gguf_q8_gemv_extreme_quants(isa):
    """Q8_0 quants of -128 (a file may hold them; the AVX512BW / AVX2 paths take |qw| = 128) against
    activations at +-max (127: dx = 1, so every float step is exact too): the integer dots stay exact
    (no 16-bit saturation)."""
    import numpy as np

    K, N = 128, 5
    d = np.frombuffer(np.float16(0.5).tobytes(), dtype=np.uint8)
    blocks = np.zeros((N, K // 32, 34), dtype=np.uint8)
    blocks[..., :2] = d
    blocks[..., 2:] = np.array([-128, 127] * 16, dtype=np.int8).view(np.uint8)
    blocks[1, :, 2:] = np.array(-128, dtype=np.int8).view(np.uint8)
    blocks = blocks.reshape(N, -1)
    x = torch.tensor([[-127.0, 127.0] * (K // 2), [127.0] * K, [-127.0] * K], dtype=torch.float32)
    got = cpu_kernels.gguf_q8_gemv(x, cpu_kernels.gguf_q8_tiles(torch.from_numpy(blocks), "Q8_0"), "Q8_0", N)
    want, _, _ = _q8_reference(x, blocks, "Q8_0")
    assert np.array_equal(got.double().numpy(), want)


def _shared_pool(g, hkv, D, dtype, page_size, groups, tails, rows, num_slots=2048):
    """A pool where requests share leading pages: groups[i] = (shared length, member indices); request r
    then owns its tail of tails[r] positions on pages of its own. Returns pools, req_to_token, seq lens."""
    kb = torch.randn(hkv, num_slots, D, generator=g).to(dtype)
    vb = torch.randn(hkv, num_slots, D, generator=g).to(dtype)
    rt = torch.zeros(max(rows) + 1, 512, dtype=torch.int64)
    pages = torch.randperm(num_slots // page_size, generator=g).tolist()

    def take(n: int) -> list[int]:
        mine = [pages.pop() for _ in range(-(-n // page_size))]
        return [mine[i // page_size] * page_size + i % page_size for i in range(n)]

    lens = list(tails)
    for shared, members in groups:
        common = take(shared)  # whole pages: a tail never writes into a shared page
        for m in members:
            lens[m] += shared
            rt[rows[m], :shared] = torch.tensor(common)
    for m, row in enumerate(rows):
        start = next((s for s, ms in groups if m in ms), 0)
        rt[row, start : lens[m]] = torch.tensor(take(lens[m] - start))
    return kb, vb, rt, lens


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (8, 2, 128), (6, 3, 13)])
def test_cascade_decode_matches_reference(isa, dtype, page_size, H, hkv, D):
    """Ragged groups (3 members sharing 80, 2 sharing 33, one request alone): the planner finds them
    from the slots, the shared part runs once per group, the decode kernel merges it: == one pass."""
    from radixlang_runtime.model.attention.cascade import plan_cascade

    g = torch.Generator().manual_seed(4)
    rows = [5, 0, 3, 1, 4, 2]
    kb, vb, rt, lens = _shared_pool(g, hkv, D, dtype, page_size, [(80, [0, 2, 5]), (33, [1, 4])],
                                    [1, 7, 20, 40, 1, 3], rows)
    plan = plan_cascade(rt, rows, [n - 1 for n in lens], list(range(6)), [1] * 6, min_shared=16)
    assert plan is not None and plan.num_groups == 2
    assert sorted(plan.group_lens.tolist()) == [33 // page_size * page_size if page_size > 1 else 33, 80] or page_size > 1
    q = torch.randn(6, H, D, generator=g).to(dtype)
    dp = isa == "avx512_bf16" and dtype == torch.bfloat16 and D % 32 == 0
    prior = cpu_kernels.empty_prior(*q.shape, dtype)
    cpu_kernels.shared_prefix(q, kb, vb, rt, plan, D ** -0.5, dp, prior)
    got = cpu_kernels.paged_decode(q, kb, vb, rt, torch.tensor(rows), torch.tensor(lens), D ** -0.5, plan.k_begin, prior)
    want = paged_attention_ref(q, kb, vb, rt, rows, [n - 1 for n in lens], [1] * 6, D ** -0.5)
    torch.testing.assert_close(got.float(), want, **_tol(dtype))
    assert torch.isinf(prior[1][3]).all()  # request 3 is in no group: its prior weighs nothing


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (8, 2, 128), (6, 3, 13)])
def test_cascade_extend_matches_reference(isa, dtype, page_size, H, hkv, D):
    """Extend with cached prefixes shared by ragged groups (the shared part reads 150 query rows of
    one group: several query blocks read one packed prefix) == the one-pass reference."""
    from radixlang_runtime.model.attention.cascade import plan_cascade

    g = torch.Generator().manual_seed(5)
    rows = [2, 0, 3, 1, 4]
    extend_lens = [150, 5, 1, 17, 30]
    cached_tails = [3, 0, 9, 20, 0]  # cached positions of each request past its group's shared part
    kb, vb, rt, seq = _shared_pool(g, hkv, D, dtype, page_size, [(64, [0, 1, 2]), (48, [3, 4])],
                                   [c + n for c, n in zip(cached_tails, extend_lens)], rows)
    prefix_lens = [s - n for s, n in zip(seq, extend_lens)]
    T = sum(extend_lens)
    q, k, v = _new_tokens(g, H, hkv, D, dtype, kb, vb, rt, rows, prefix_lens, extend_lens)
    starts = [sum(extend_lens[:i]) for i in range(5)]
    plan = plan_cascade(rt, rows, prefix_lens, starts, extend_lens, min_shared=16)
    assert plan is not None and plan.num_groups == 2 and plan.max_group_rows == 156
    dp = isa == "avx512_bf16" and dtype == torch.bfloat16 and D % 32 == 0
    prior = cpu_kernels.empty_prior(*q.shape, dtype)
    cpu_kernels.shared_prefix(q, kb, vb, rt, plan, D ** -0.5, dp, prior)
    prefix = cpu_kernels.PagedPrefix(kb, vb, rt, torch.tensor(rows), torch.tensor(prefix_lens), plan.k_begin)
    got = cpu_kernels.extend_causal(q, k, v, torch.tensor(starts), torch.tensor(extend_lens), D ** -0.5, prefix, dp,
                                    prior)
    want = paged_attention_ref(q, kb, vb, rt, rows, prefix_lens, extend_lens, D ** -0.5)
    torch.testing.assert_close(got.view(T, H, D).float(), want, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_shared_prefix_lse_and_merge_rule(isa, dtype):
    """The shared part's log-sum-exp is the scores' (checked against torch), and merging two halves of
    a sequence with the reference merge_states gives attention over the whole."""
    from kernels.reference import merge_states
    from radixlang_runtime.model.attention.cascade import CascadePlan

    g = torch.Generator().manual_seed(6)
    H, hkv, D, L = 4, 2, 64, 90
    kb = torch.randn(hkv, 256, D, generator=g).to(dtype)
    vb = torch.randn(hkv, 256, D, generator=g).to(dtype)
    rt = torch.randperm(256, generator=g)[:L].view(1, L).clone()
    q = torch.randn(3, H, D, generator=g).to(dtype)
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    plan = CascadePlan(t([0]), t([50]), t([0, 2]), t([0, 2]), t([2]), t([50, 0, 50]), 2, 50)
    dp = isa == "avx512_bf16" and dtype == torch.bfloat16
    o, lse = cpu_kernels.empty_prior(*q.shape, dtype)
    cpu_kernels.shared_prefix(q, kb, vb, rt, plan, D ** -0.5, dp, (o, lse))
    k = kb[:, rt[0, :50]].float().repeat_interleave(H // hkv, 0)  # [H, 50, D]
    s = torch.einsum("bhd,hld->bhl", q.float(), k) * D ** -0.5
    torch.testing.assert_close(lse[[0, 2]], torch.logsumexp(s[[0, 2]], -1), **_tol(dtype))
    assert torch.isinf(lse[1]).all()
    # the second half through the decode kernel's own part, merged by the reference rule
    own = cpu_kernels.paged_decode(q[[0]], kb, vb, rt, t([0]), t([L]), D ** -0.5, t([50]))
    v = vb[:, rt[0, 50:]].float().repeat_interleave(H // hkv, 0)
    k2 = kb[:, rt[0, 50:]].float().repeat_interleave(H // hkv, 0)
    lse2 = torch.logsumexp(torch.einsum("hd,hld->hl", q[0].float(), k2) * D ** -0.5, -1)
    merged = merge_states(o[[0]], lse[[0]], own, lse2[None])
    want = paged_attention_ref(q[[0]], kb, vb, rt, [0], [L - 1], [1], D ** -0.5)
    torch.testing.assert_close(merged, want, **_tol(dtype))
    del v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("T,H,hkv,D", [(1, 9, 3, 64), (100, 9, 3, 64), (70, 4, 2, 32), (5, 8, 8, 128)])
def test_rope_store_is_bit_identical_to_rotary_and_store(isa, dtype, T, H, hkv, D):
    """rope_store == Rotary.apply + KVPool.store, bit for bit (T >= 64 takes the threaded loop); qkv rows
    with a stride wider than their heads (a padded buffer) and scattered slots."""
    from radixlang_runtime.mem.kv_pool import KVPool
    from radixlang_runtime.model.llama import Rotary

    g = torch.Generator().manual_seed(5)
    width = (H + 2 * hkv) * D
    buf = (torch.randn(T, width + 8, generator=g) * 4).to(dtype)
    qkv = buf[:, :width]
    rot = Rotary(D, 10000.0, 4096, torch.device("cpu"), dtype)
    cos, sin = rot.cos_sin(torch.randint(0, 4096, (T,), generator=g))
    slots = torch.randperm(300, generator=g)[:T]
    pools = [KVPool(300, 1, hkv, D, dtype, torch.device("cpu"), 1, 8) for _ in range(2)]

    heads = qkv.reshape(T, H + 2 * hkv, D)
    want = Rotary.apply(heads[:, : H + hkv], (cos, sin))
    pools[0].store(0, slots, want[:, H:], heads[:, H + hkv :])
    got = qkv.clone()
    cpu_kernels.rope_store(got, cos, sin, H, hkv, D, slots, pools[1].k_buffers[0], pools[1].v_buffers[0])
    got = got.view(T, H + 2 * hkv, D)
    assert torch.equal(got[:, : H + hkv], want)
    assert torch.equal(got[:, H + hkv :], heads[:, H + hkv :])  # v untouched
    assert torch.equal(pools[1].k_buffers[0], pools[0].k_buffers[0])
    assert torch.equal(pools[1].v_buffers[0], pools[0].v_buffers[0])
