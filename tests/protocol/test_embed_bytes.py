"""embed_bytes.py against torch's casts, bit for bit: normal, subnormal, tie, overflow, infinite and NaN inputs in
every embed_dtype and byte order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixlang_runtime.protocol.embed_bytes import EMBED_DTYPES, bfloat16_bits, embedding_bytes, fp8_bits

EDGES = [0.0, -0.0, 448, 449, 464, 465, 470, 479.9, 480, 500, 57344, 60000, 61439, 61440, 62000, 65536, 1e6, 3.4e38,
         np.inf, -np.inf, np.nan, 2 ** -6, 2 ** -9, 2 ** -10, 1.5 * 2 ** -10, 3 * 2 ** -11, 2 ** -14, 2 ** -16,
         2 ** -17, 1.5 * 2 ** -17, 1e-30, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8]


def _values() -> np.ndarray:
    g = np.random.default_rng(0)
    return np.concatenate([g.normal(0, s, 4000) for s in (1e-3, 1.0, 100.0, 3e4)] + [EDGES]).astype(np.float32)


@pytest.mark.parametrize("name, torch_dtype", [("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)])
def test_fp8_equals_torchs_cast(name, torch_dtype):
    x = _values()
    want = torch.from_numpy(x).to(torch_dtype).view(torch.uint8).numpy()
    assert np.array_equal(fp8_bits(x, name), want)


def test_bfloat16_equals_torchs_cast():
    x = _values()
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    got = bfloat16_bits(x)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.isnan(torch.from_numpy(got[nan].view(np.int16)).view(torch.bfloat16).float().numpy()).all()


@pytest.mark.parametrize("dtype", EMBED_DTYPES)
@pytest.mark.parametrize("order", ["little", "big", "native"])
def test_bytes_round_trip_through_torch(dtype, order):
    vec = [0.5, -0.25, 0.1, 3.0, -7.75]
    raw = embedding_bytes(vec, dtype, order)
    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                   "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[dtype]
    width = torch.tensor([], dtype=torch_dtype).element_size()
    assert len(raw) == width * len(vec)
    as_little = raw if order == "little" or width == 1 or (order == "native" and np.little_endian) else b"".join(
        raw[i:i + width][::-1] for i in range(0, len(raw), width))
    back = torch.frombuffer(bytearray(as_little), dtype=torch_dtype).float().tolist()
    assert back == torch.tensor(vec).to(torch_dtype).float().tolist()
    with pytest.raises(ValueError, match="embed_dtype"):
        embedding_bytes(vec, "float64")
