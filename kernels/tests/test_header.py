"""The op table's header parser (header.py) on kernels.h: every C entry point declared once and typed from
there, struct layouts equal to the compiler's, and everything outside the parsed subset refused by name."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from radixlang_kernels import cpu_ops
from radixlang_kernels.cpu_caps import detect
from radixlang_kernels.header import HeaderError, parse_header, read_header
from radixlang_kernels.op_table import HEADER, SOURCE_DIR, header

P, I64, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


@pytest.mark.skipif(shutil.which("nm") is None or cpu_ops.load() is None, reason="no library or no nm")
def test_every_exported_function_is_declared_once_in_the_header():
    """The library's exported functions (nm) are exactly the header's prototypes, each declared once."""
    hdr = header()
    out = subprocess.run(["nm", "-D", "--defined-only", cpu_ops.load().path], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    exported = {f[2] for f in (line.split() for line in out.splitlines()) if len(f) == 3 and f[1] == "T"}
    assert exported == set(hdr.prototypes)
    assert len(hdr.prototypes) == 26
    assert set(hdr.structs) == {"decode_linear", "decode_layer_weights", "decode_step"}
    with pytest.raises(AttributeError, match="not declared in kernels.h"):
        _ = cpu_ops.load().paged_decode  # a name the header does not declare


def test_signatures_typed_from_the_header():
    """The types the hand-written table used to state, now derived (paged decode, extend, norm, decode_layer)."""
    p = header().prototypes
    assert p["paged_decode_bf16"].argtypes == (P,) * 9 + (I64,) * 6 + (F32, P)
    assert p["paged_decode_bf16"].restype is ctypes.c_int
    assert p["extend_causal_f32"].argtypes == ((P, I64) * 3 + (P,) * 2 + (I64,) * 4 + (F32, P) + (P,) * 2
                                                + (I64, P, I64) + (P,) * 7 + (I64,))
    assert p["add_rms_norm_f32"].restype is None and p["add_rms_norm_f32"].argtypes == (P,) * 4 + (I64,) * 2 + (F32,)
    assert p["int8_q8_gemv"].argtypes == (P, ctypes.c_int, P, P, P, ctypes.c_int) + (I64,) * 3
    assert p["dense_any_m_f32"].argtypes == ()
    structs = header().structs
    w = p["decode_layer_f32"].argtypes
    assert w[0]._type_ is structs["decode_layer_weights"] and w[1]._type_ is structs["decode_step"]
    assert p["decode_layer_f32"].params == ("W", "S", "residual", "h", "out")


@pytest.mark.parametrize("text,names", [
    ("#define ARGS(T) const T *q\nint f(ARGS(float));", ["#define ARGS(T)"]),
    ("int f(const float q[4]);", ["f", "arrays"]),
    ("int f(const float *q, ...);", ["f"]),
    ("int f(void (*cb)(int));", ["f"]),
    ("int f(const half *q);", ["f(q)", "half"]),
    ("double f(int n);", ["f", "double"]),
    ("typedef struct { int64_t a; } s;\nint f(s v);", ["f(v)", "struct s"]),
    ("int f(uint16_t v);", ["f(v)", "uint16_t"]),
    ("int f(int n);\nint f(int n);", ["f declared twice"]),
    ("typedef struct { float x[4]; } s;", ["struct s"]),
    ("static inline int f(int n) { return n; }", ["static inline int f"]),
])
def test_outside_the_subset_is_refused_by_name(text, names):
    with pytest.raises(HeaderError) as e:
        parse_header(text, "t.h")
    for n in names:
        assert n in str(e.value)


_LAYOUT_C = r"""
#include <stddef.h>
#include <stdio.h>
#include "kernels.h"
#define F(s, f) printf("%s.%s %zu\n", #s, #f, offsetof(s, f));
int main(void) {
    printf("decode_linear %zu\ndecode_layer_weights %zu\ndecode_step %zu\n", sizeof(decode_linear),
           sizeof(decode_layer_weights), sizeof(decode_step));
    F(decode_linear, bias) F(decode_layer_weights, post_norm) F(decode_layer_weights, window)
    F(decode_step, eps) F(decode_step, scale) F(decode_step, cos) F(decode_step, k_pools) F(decode_step, groups)
    F(decode_step, prior_lse) F(decode_step, win_begin)
    return 0;
}
"""


@pytest.mark.skipif(detect().compiler is None, reason="no C compiler")
def test_struct_layouts_match_the_compiler(tmp_path):
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text(_LAYOUT_C)
    subprocess.run([detect().compiler, f"-I{SOURCE_DIR}", str(src), "-o", str(exe)], check=True, timeout=60)
    got = dict(line.rsplit(" ", 1) for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                              check=True).stdout.splitlines())
    structs = read_header(HEADER).structs
    for name, s in structs.items():
        assert int(got[name]) == ctypes.sizeof(s), name
    for key, off in got.items():
        if "." in key:
            s, field = key.split(".")
            assert getattr(structs[s], field).offset == int(off), key
