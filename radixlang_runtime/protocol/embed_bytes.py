"""An embedding vector as the bytes of vLLM's base64 payload: `embed_dtype` float32 | float16 | bfloat16 |
fp8_e4m3 | fp8_e5m2 in `endianness` native | little | big (one-byte types have none).

Every cast rounds to nearest, ties to even, as torch casts: bfloat16 keeps a float32's upper half (NaN stays a
quiet NaN); fp8_e4m3 is float8_e4m3fn (bias 7, three mantissa bits, largest 448, no infinity: a value that rounds
past 448, infinity included, saturates at 448, as torch 2.13 casts), fp8_e5m2 is float8_e5m2 (bias 15, two
mantissa bits, largest 57344; past it, infinity). Both fp8 types have subnormals; NaN is 0x7F. NumPy, no torch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

EMBED_DTYPES = ("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2")
ENDIANNESS = {"native": "=", "little": "<", "big": ">"}
# fp8 layouts: (exponent bias, mantissa bits, largest finite value, the bits past it: saturated or infinity)
_FP8 = {"fp8_e4m3": (7, 3, 448.0, 0x7E), "fp8_e5m2": (15, 2, 57344.0, 0x7C)}


def embedding_bytes(vec: Sequence[float], dtype: str, endianness: str = "native") -> bytes:
    """The vector's elements as `dtype` in `endianness`'s byte order (EMBED_DTYPES, ENDIANNESS)."""
    x = np.asarray(vec, dtype=np.float32)
    order = ENDIANNESS[endianness]
    if dtype == "float32":
        return x.astype(order + "f4").tobytes()
    if dtype == "float16":
        return x.astype(order + "f2").tobytes()
    if dtype == "bfloat16":
        return bfloat16_bits(x).astype(order + "u2").tobytes()
    if dtype in _FP8:
        return fp8_bits(x, dtype).tobytes()
    raise ValueError(f"embed_dtype {dtype!r}: known are {', '.join(EMBED_DTYPES)}")


def bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even; NaN -> 0x7FC0 with its sign."""
    bits = x.astype(np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    nan = np.isnan(x)
    return np.where(nan, (bits >> np.uint32(16)) & np.uint32(0x8000) | np.uint32(0x7FC0), rounded).astype(np.uint16)


def fp8_bits(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> fp8 bit patterns (uint8) of `dtype` (fp8_e4m3 | fp8_e5m2), rounded to nearest even."""
    bias, man, largest, past = _FP8[dtype]
    sign = np.signbit(x).astype(np.uint8) << np.uint8(7)
    a = np.abs(x.astype(np.float64))
    a = np.where(np.isfinite(a), a, 0.0)  # inf / NaN: their own bits below
    low = 1 - bias  # the smallest normal exponent; below it the quantum stays 2 ** (low - man) (subnormals)
    e = np.maximum(np.floor(np.log2(np.where(a > 0, a, 1.0))), low)
    r = np.round(a / np.exp2(e - man)) * np.exp2(e - man)  # NumPy rounds half to even
    er = np.maximum(np.floor(np.log2(np.where(r > 0, r, 1.0))), low)  # rounding may carry into the next binade
    normal = r >= np.exp2(low)
    field = np.where(normal, er + bias, 0).astype(np.int64)
    mant = np.where(normal, r / np.exp2(er - man) - 2 ** man, r / np.exp2(low - man)).astype(np.int64)
    out = ((field << man) | mant).astype(np.uint8)
    out = np.where((r > largest) | np.isinf(x), np.uint8(past), out)
    return (np.where(np.isnan(x), np.uint8(0x7F), out) | sign).astype(np.uint8)
