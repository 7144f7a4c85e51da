"""The `isa` pytest fixture: a kernel test runs once per instruction set this machine has, each time on a
library built for exactly that set (the same sources, built under a mask), installed as cpu_ops' library.
Test suites import it into their conftest.py (`from radixlang_kernels.testing import isa`)."""

from __future__ import annotations

import dataclasses

import pytest

from radixlang_kernels.cpu_caps import apply_mask, detect, parse_mask
from radixlang_kernels.op_table import build_library

_MASKS = {"avx512_bf16": "", "avx512": "avx512_bf16", "avx2": "avx512", "scalar": "avx2"}


def isas() -> list[str]:
    """This machine's own instruction set and every weaker one (x86-64); elsewhere its own only."""
    caps = detect()
    if caps.arch not in ("x86_64", "AMD64"):
        return [caps.isa]
    order = ["avx512_bf16", "avx512", "avx2", "scalar"]
    return order[order.index(caps.isa):]


@pytest.fixture(params=isas())
def isa(request, monkeypatch):
    """Installs the library built for one instruction set as cpu_ops' library for the test."""
    from radixlang_kernels import cpu_ops  # torch: imported by the tests that use the fixture only

    caps = detect()
    masked = caps.masked | parse_mask(_MASKS[request.param])
    caps = dataclasses.replace(caps, features=apply_mask(caps.features, masked), masked=masked)
    assert caps.isa == request.param
    lib = build_library(caps)
    assert lib is not None, "the kernels must build for every instruction set of this CPU"
    # load the process's own library first: a load() inside the test (a module's constructor) must not
    # leave "tried" set with the patched library restored to None afterwards
    cpu_ops.load()
    monkeypatch.setattr(cpu_ops, "_lib", lib)
    return request.param
