"""Test support for the kernels (test suites import from here; no conftest.py in kernels/tests, whose
modules run in one pytest call with tests/, where `from conftest import ...` must find tests/conftest.py):
- the `isa` fixture's two halves: isas() (its params) and use_isa_library (its body): a kernel test runs
  once per instruction set this machine has, each time on a library built for exactly that set (the same
  sources, built under a mask), installed as cpu_ops' library;
- interpret_triton_without_gpu: Triton kernels run interpreted where there is no GPU."""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import numpy as np

from radixlang_kernels.cpu_caps import apply_mask, detect, parse_mask
from radixlang_kernels.op_table import build_library

def interpret_triton_without_gpu() -> None:
    """TRITON_INTERPRET=1 where there is no GPU (nvidia-smi); before triton is first imported."""
    if shutil.which("nvidia-smi") is None:
        os.environ.setdefault("TRITON_INTERPRET", "1")


# the fixture's avx512 build is AVX512BW without VNNI (Skylake's paths); with VNNI (Cascade / Ice Lake) the int8
# kernels compile the avx512_bf16 build's VNNI code (kernels/tests/test_gguf_gemm.py builds that one too)
_MASKS = {"avx512_bf16": "", "avx512": "avx512_bf16,avx512_vnni", "avx2": "avx512", "scalar": "avx2"}


def isas() -> list[str]:
    """This machine's own instruction set and every weaker one (x86-64); elsewhere its own only."""
    caps = detect()
    if caps.arch not in ("x86_64", "AMD64"):
        return [caps.isa]
    order = ["avx512_bf16", "avx512", "avx2", "scalar"]
    return order[order.index(caps.isa):]


def use_isa_library(isa: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Installs the library built for instruction set `isa` as cpu_ops' library for the test; returns isa."""
    from radixlang_kernels import cpu_ops  # torch: imported by the tests that use the fixture only

    caps = detect()
    masked = caps.masked | parse_mask(_MASKS[isa])
    caps = dataclasses.replace(caps, features=apply_mask(caps.features, masked), masked=masked)
    assert caps.isa == isa
    lib = build_library(caps)
    assert lib is not None, "the kernels must build for every instruction set of this CPU"
    # load the process's own library first: a load() inside the test (a module's constructor) must not
    # leave "tried" set with the patched library restored to None afterwards
    cpu_ops.load()
    monkeypatch.setattr(cpu_ops, "_lib", lib)
    return isa


# the fp16 scale fields of each GGUF block type (byte offsets in a block): random blocks get finite scales
_GGUF_HALF_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82),
                     "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,)}


def random_gguf_blocks(fmt: str, rows: int, K: int, std: float, rng) -> "np.ndarray":
    """rows x K weights of about `std` as GGUF blocks of `fmt` -> [rows, K / QK * bytes] uint8. Types
    gguf.quants can quantize (the legacy ones) are quantized from normal values; the others (K-quants,
    IQ4) are random quants with finite random scales, rescaled to `std` (any bytes are valid blocks)."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.quants import dequantize, quantize

    qt = GGMLQuantizationType[fmt]
    qk, nbytes = GGML_QUANT_SIZES[qt]
    try:
        return quantize(rng.normal(0, std, (rows, K)).astype(np.float32), qt)
    except NotImplementedError:
        pass
    b = rng.integers(0, 256, (rows, K // qk, nbytes), dtype=np.uint8)
    for off in _GGUF_HALF_FIELDS[fmt]:
        b[..., off:off + 2] = rng.uniform(0.5, 1.0, (rows, K // qk)).astype(np.float16).view(np.uint8).reshape(
            rows, K // qk, 2)
    b = b.reshape(rows, -1)
    factor = std / max(float(dequantize(b, qt).std()), 1e-12)
    b = b.reshape(rows, K // qk, nbytes)
    for off in _GGUF_HALF_FIELDS[fmt]:
        h = b[..., off:off + 2].copy().view(np.float16).astype(np.float32) * factor
        b[..., off:off + 2] = h.astype(np.float16).view(np.uint8)
    return np.ascontiguousarray(b.reshape(rows, -1))
