"""GGUF block types at load (gguf_convert.dequantize_tensor): each type read back from a real file written by
gguf.GGUFWriter. Types gguf.quants can quantize round-trip within the type's step; the K-quants (which gguf
only dequantizes) are built as random blocks and checked against a scalar decoder written here from ggml's
block layouts (ggml-quants.c dequantize_row_q{4,5,6}_K, dequantize_row_mxfp4); a type outside BLOCK_TYPES is
refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from gguf_tiny import K_BLOCKS, k_quant_blocks
from radixlang_runtime.model.loader.gguf_convert import BLOCK_TYPES, dequantize_tensor

ROWS, COLS = 4, 512  # two 256-value super-blocks per row


def _read_back(tmp_path, kind: str, data: np.ndarray) -> np.ndarray:
    """data written as one tensor of block type `kind` (float32 values for F32, else raw bytes / values that
    gguf.quants.quantize turns into blocks), read back through the loader."""
    import gguf
    from gguf import GGMLQuantizationType as T

    path = str(tmp_path / f"{kind}.gguf")
    w = gguf.GGUFWriter(path, "llama")
    if data.dtype == np.uint8:
        w.add_tensor("t", data, raw_dtype=T[kind])
    elif kind == "F32":
        w.add_tensor("t", data)
    else:
        w.add_tensor("t", gguf.quants.quantize(data, T[kind]), raw_dtype=T[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (t,) = gguf.GGUFReader(path).tensors
    assert t.tensor_type.name == kind
    return dequantize_tensor(t)


# the largest error a type's rounding allows, as a fraction of the tensor's largest |value|
ROUND_TRIP = {"F32": 0.0, "F16": 1e-3, "BF16": 8e-3, "Q8_0": 1 / 127, "Q5_0": 1 / 16, "Q5_1": 1 / 16,
              "Q4_0": 1 / 8, "Q4_1": 1 / 8}


@pytest.mark.parametrize("kind", sorted(ROUND_TRIP))
def test_round_trip_within_the_types_step(kind, tmp_path):
    x = np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(np.float32)
    got = _read_back(tmp_path, kind, x)
    assert got.shape == x.shape and got.dtype == np.float32
    assert np.abs(got - x).max() <= ROUND_TRIP[kind] * np.abs(x).max()
    if kind != "F32":
        assert np.abs(got - x).max() > 0  # really quantized (the bound is the type's, not a no-op)


def _half(b: np.ndarray, offset: int) -> float:
    return float(np.frombuffer(b[offset:offset + 2].tobytes(), np.float16)[0])


def _scale_min_k4(j: int, q: np.ndarray) -> tuple[int, int]:
    if j < 4:
        return int(q[j] & 63), int(q[j + 4] & 63)
    return (int((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)), int((q[j + 4] >> 4) | ((q[j] >> 6) << 4)))


def ref_q4_k(b: np.ndarray) -> list[float]:
    d, dmin = _half(b, 0), _half(b, 2)
    scales, qs, y = b[4:16], b[16:144], []
    for j in range(4):  # 64 values per step: low nibbles with scale 2j, high nibbles with scale 2j + 1
        (s1, m1), (s2, m2) = _scale_min_k4(2 * j, scales), _scale_min_k4(2 * j + 1, scales)
        q = qs[32 * j: 32 * j + 32]
        y += [d * s1 * (int(v) & 0xF) - dmin * m1 for v in q] + [d * s2 * (int(v) >> 4) - dmin * m2 for v in q]
    return y


def ref_q5_k(b: np.ndarray) -> list[float]:
    d, dmin = _half(b, 0), _half(b, 2)
    scales, qh, qs, y = b[4:16], b[16:48], b[48:176], []
    for j in range(4):
        (s1, m1), (s2, m2) = _scale_min_k4(2 * j, scales), _scale_min_k4(2 * j + 1, scales)
        u1, u2, q = 1 << (2 * j), 2 << (2 * j), qs[32 * j: 32 * j + 32]
        y += [d * s1 * ((int(v) & 0xF) + (16 if qh[i] & u1 else 0)) - dmin * m1 for i, v in enumerate(q)]
        y += [d * s2 * ((int(v) >> 4) + (16 if qh[i] & u2 else 0)) - dmin * m2 for i, v in enumerate(q)]
    return y


def ref_q6_k(b: np.ndarray) -> list[float]:
    ql, qh, sc = b[0:128], b[128:192], b[192:208].view(np.int8)
    d = _half(b, 208)
    y = [0.0] * 256
    for n in range(2):  # 128 values per half
        L, H, S = ql[64 * n:], qh[32 * n:], sc[8 * n:]
        for i in range(32):
            s = i // 16
            q = [(int(L[i]) & 0xF) | ((int(H[i]) >> 0 & 3) << 4), (int(L[i + 32]) & 0xF) | ((int(H[i]) >> 2 & 3) << 4),
                 (int(L[i]) >> 4) | ((int(H[i]) >> 4 & 3) << 4), (int(L[i + 32]) >> 4) | ((int(H[i]) >> 6 & 3) << 4)]
            for k in range(4):
                y[128 * n + i + 32 * k] = d * int(S[s + 2 * k]) * (q[k] - 32)
    return y


K_QUANTS = {"Q4_K": ref_q4_k, "Q5_K": ref_q5_k, "Q6_K": ref_q6_k}  # ggml's layouts, decoded here


@pytest.mark.parametrize("kind", sorted(K_QUANTS))
def test_k_quants_match_ggmls_layout(kind, tmp_path):
    size, ref = K_BLOCKS[kind][0], K_QUANTS[kind]
    blocks = k_quant_blocks(kind, ROWS, COLS)
    got = _read_back(tmp_path, kind, blocks)
    assert got.shape == (ROWS, COLS)
    want = np.array([[v for blk in row.reshape(-1, size) for v in ref(blk)] for row in blocks], dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.abs(want).max() > 0


# decoded by the C kernels' own reader of ggml's layouts (gguf_blocks.h), written apart from gguf.quants
C_DECODED = ("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS")


@pytest.mark.parametrize("kind", C_DECODED)
def test_other_types_match_the_kernels_decoder(kind, tmp_path):
    import torch

    from radixlang_kernels import cpu_ops, quant_ops
    from radixlang_kernels.testing import random_gguf_blocks

    if cpu_ops.load() is None:
        pytest.skip("no C compiler")
    blocks = random_gguf_blocks(kind, ROWS, COLS, 1.0, np.random.default_rng(3))
    got = _read_back(tmp_path, kind, blocks)
    want = quant_ops.gguf_dequant_rows(torch.from_numpy(blocks), kind, COLS, torch.float32).numpy()
    np.testing.assert_array_equal(got, want)
    assert np.abs(want).max() > 0


_E2M1 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # ggml's kvalues_mxfp4 (doubled values)


def ref_mxfp4(b: np.ndarray) -> list[float]:
    """ggml-quants.c dequantize_row_mxfp4, one 17-byte block: an E8M0 exponent e (scale 2^(e - 128), the doubled
    values' half), then 16 bytes: value j from the low nibble of byte j, value j + 16 from its high nibble."""
    d = 2.0 ** (int(b[0]) - 128)
    q = b[1:17]
    return [_E2M1[int(x) & 0xF] * d for x in q] + [_E2M1[int(x) >> 4] * d for x in q]


def test_mxfp4_matches_ggmls_layout(tmp_path):
    """gpt-oss's experts (llama.cpp writes the checkpoints' MXFP4 blocks as they are)."""
    rng = np.random.default_rng(5)
    blocks = rng.integers(0, 256, (ROWS, COLS // 32, 17), dtype=np.uint8)
    blocks[:, :, 0] = rng.integers(118, 134, (ROWS, COLS // 32))  # exponents around 2^0
    got = _read_back(tmp_path, "MXFP4", blocks.reshape(ROWS, -1))
    want = np.array([[v for blk in row for v in ref_mxfp4(blk)] for row in blocks], dtype=np.float32)
    np.testing.assert_array_equal(got, want)
    assert np.abs(want).max() > 0


def test_every_listed_block_type_is_tested():
    assert set(BLOCK_TYPES) == set(ROUND_TRIP) | set(K_QUANTS) | set(C_DECODED) | {"MXFP4"}


def test_other_block_types_are_refused_by_name():
    from gguf import GGMLQuantizationType as T

    class Tensor:
        name, tensor_type, data = "blk.0.ffn_up.weight", T.IQ2_XXS, np.zeros((1, 66), np.uint8)

    with pytest.raises(ValueError, match="'blk.0.ffn_up.weight' is stored as IQ2_XXS: supported block types are F32"):
        dequantize_tensor(Tensor())
