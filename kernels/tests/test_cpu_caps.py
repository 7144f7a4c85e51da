"""The capability mask (RADIXLANG_CPU_MASK): what it hides and the kernel build it selects (the Engine and
server run under it: tests/project/test_cpu_mask.py)."""

from __future__ import annotations

import dataclasses

import pytest

from radixlang_kernels.cpu_caps import CpuCaps, apply_mask, parse_mask

ZEN5 = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_bf16",
                  "avx512_vnni", "amx_bf16"})


def test_mask_words_and_isa():
    assert parse_mask("avx512") == {"avx512", "avx512_bf16", "avx512_vnni"}
    assert parse_mask("avx2") == {"avx2", "avx512", "avx512_bf16", "avx512_vnni"}
    with pytest.raises(ValueError, match="sse9"):
        parse_mask("sse9")
    caps = CpuCaps("x86_64", ZEN5, frozenset(), "/usr/bin/cc")
    want = {"": ("avx512_bf16", True), "avx512_bf16": ("avx512", False), "avx512": ("avx2", False),
            "avx2": ("scalar", False)}
    for word, (isa, bf16) in want.items():
        m = parse_mask(word)
        c = dataclasses.replace(caps, features=apply_mask(ZEN5, m), masked=m)
        assert (c.isa, c.native_bf16) == (isa, bf16)
        assert "-march=native" not in c.kernel_cflags()
    no_bf16 = dataclasses.replace(caps, features=apply_mask(ZEN5, parse_mask("avx512_bf16")))
    assert "-mavx512bf16" not in no_bf16.kernel_cflags() and "-mavx512vnni" in no_bf16.kernel_cflags()
    skylake = dataclasses.replace(caps, features=apply_mask(ZEN5, parse_mask("avx512_bf16,avx512_vnni")))
    assert skylake.isa == "avx512" and "-mavx512vnni" not in skylake.kernel_cflags()


def test_library_key_changes_with_features():
    from radixlang_kernels.op_table import library_key

    a = CpuCaps("x86_64", ZEN5, frozenset(), "cc")
    b = dataclasses.replace(a, features=apply_mask(ZEN5, parse_mask("avx512_bf16")))
    assert library_key(a, "cc") != library_key(b, "cc")


def test_a_failed_build_leaves_no_library_and_no_objects(tmp_path, monkeypatch):
    """A compiler that fails on one source while the others compile side by side (here it only writes their
    objects): no library, and nothing left in the cache directory."""
    from radixlang_kernels.op_table import build_library

    wrapper = tmp_path / "cc-fails-on-gemv"
    log = tmp_path / "calls"
    wrapper.write_text(f"""#!/bin/sh
echo "$*" >> {log}
case "$*" in *" -c "*/gemv.c*) echo "gemv.c: error" >&2; exit 1;; esac
while [ "$1" != "-o" ]; do shift; done
: > "$2"
""")
    wrapper.chmod(0o755)
    monkeypatch.setenv("RADIXLANG_CACHE_DIR", str(tmp_path / "cache"))
    caps = CpuCaps("x86_64", frozenset(), frozenset(), str(wrapper))
    assert build_library(caps) is None
    calls = log.read_text().splitlines()
    assert sum(" -c " in c for c in calls) == len(calls) >= 10  # an object per source; no link after a failure
    assert list((tmp_path / "cache" / "kernels").iterdir()) == []
