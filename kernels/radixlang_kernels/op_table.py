"""Build, cache and load the CPU kernel library; its entry points typed from the one header (torch-free).

All csrc/cpu/*.c files compile once (an object each, as many at once as the process has CPUs) into one shared
library for exactly the feature set cpu_caps.detect() allows (`kernel_cflags`, never -march=native), cached
under $RADIXLANG_CACHE_DIR/kernels (default ~/.cache/radixlang/kernels) with a key of the sources, the
compiler, the flags and the CPU's features. Without a compiler (or with the mask word `cc`), or when the build
fails, there is no library and every operation runs torch ops (cpu_ops.plan). The library links the same
libgomp.so.1 torch already loaded, so both share one OpenMP thread pool.

OpTable: the loaded library with one attribute per prototype of csrc/cpu/kernels.h, typed by
header.parse_header; each signature is written once, in the header.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Sequence

from radixlang_kernels.cpu_caps import CpuCaps
from radixlang_kernels.header import Header, HeaderError, read_header

logger = logging.getLogger(__name__)


def _source_dir() -> str:
    """csrc/cpu: inside the package when installed from a wheel, beside it in the source tree."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.path.join(here, "csrc", "cpu"), os.path.join(os.path.dirname(here), "csrc", "cpu")):
        if os.path.isfile(os.path.join(d, "kernels.h")):
            return d
    raise FileNotFoundError(f"the C kernel sources (csrc/cpu/kernels.h) are missing beside {here}")


SOURCE_DIR = _source_dir()
HEADER = os.path.join(SOURCE_DIR, "kernels.h")
_SRCS = sorted(os.path.join(SOURCE_DIR, f) for f in os.listdir(SOURCE_DIR) if f.endswith(".c"))
_HDRS = sorted(os.path.join(SOURCE_DIR, f) for f in os.listdir(SOURCE_DIR) if f.endswith(".h"))


@functools.lru_cache(maxsize=1)
def header() -> Header:
    """kernels.h parsed once per process: every library shares its struct classes."""
    return read_header(HEADER)


class OpTable:
    """A built library: one ctypes function per prototype of the header (argtypes / restype from it)."""

    def __init__(self, path: str, hdr: Header):
        self.path = path
        self.structs = hdr.structs
        cdll = ctypes.CDLL(path)
        missing = []
        for name, proto in hdr.prototypes.items():
            fn = getattr(cdll, name, None)
            if fn is None:
                missing.append(name)
                continue
            fn.restype, fn.argtypes = proto.restype, list(proto.argtypes)
            setattr(self, name, fn)
        if missing:
            raise HeaderError(f"{path}: declared in kernels.h but not defined: {missing}")
        self._cdll = cdll

    def __getattr__(self, name: str) -> Any:  # only reached for names the header does not declare
        raise AttributeError(f"{name!r} is not declared in kernels.h (the op table holds only its prototypes)")


def pointer_array(ptrs: Sequence[int]) -> Any:
    """A C array of pointers (`void *const *` in a struct), for the struct fields the header types so."""
    return (ctypes.c_void_p * len(ptrs))(*ptrs)


def _cache_dir() -> str:
    root = os.environ.get("RADIXLANG_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "radixlang")
    return os.path.join(root, "kernels")


def build_flags(caps: CpuCaps) -> list[str]:
    return ["-O3", *caps.kernel_cflags(), "-fno-math-errno", "-fopenmp", "-fPIC", "-shared"]


def library_key(caps: CpuCaps, cc: str) -> str:
    """Sources + compiler + flags + the CPU's (masked) features: a library never crosses CPUs."""
    h = hashlib.sha1()
    for p in _SRCS + _HDRS:
        with open(p, "rb") as f:
            h.update(f.read())
    h.update(" ".join([cc, *build_flags(caps), caps.arch, *sorted(caps.features)]).encode())
    return h.hexdigest()[:16]


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call on this platform
        return os.cpu_count() or 1


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        return subprocess.CompletedProcess(cmd, 1, "", str(e))


def _compile(cc: str, flags: list[str], out: str) -> subprocess.CompletedProcess:
    """Each source compiles to its own object, as many at once as this process may use CPUs; then one link."""
    compile_flags = [f for f in flags if f != "-shared"]
    with tempfile.TemporaryDirectory(dir=os.path.dirname(out)) as objdir:
        objs = [os.path.join(objdir, os.path.basename(src)[:-2] + ".o") for src in _SRCS]
        cmds = [[cc, *compile_flags, "-c", src, "-o", obj] for src, obj in zip(_SRCS, objs)]
        with ThreadPoolExecutor(max(1, min(_cpus(), len(cmds)))) as pool:
            failed = [r for r in pool.map(_run, cmds) if r.returncode != 0]
        if failed:
            return failed[0]
        return _run([cc, *flags, *objs, "-o", out, "-lm"])


def build_library(caps: CpuCaps) -> Optional[OpTable]:
    """Compile (or reuse from the cache) the library for `caps`; None without a compiler or on failure.
    Tests build one per instruction set the machine has, to run every kernel path."""
    if caps.compiler is None:
        logger.warning("no C compiler (or masked): the CPU path uses torch ops only")
        return None
    hdr = header()  # a header outside the parser's subset fails here, before any compile
    so = os.path.join(_cache_dir(), f"radixlang_cpu-{caps.isa}-{library_key(caps, caps.compiler)}.so")
    if not os.path.exists(so):
        os.makedirs(_cache_dir(), exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=_cache_dir())
        os.close(fd)
        res = _compile(caps.compiler, build_flags(caps), tmp)
        if res.returncode != 0:
            if os.path.exists(tmp):  # the compiler may have removed its failed output already
                os.unlink(tmp)
            logger.warning("building the CPU kernels failed, using torch ops:\n%s", res.stderr[-2000:])
            return None
        os.replace(tmp, so)
    return OpTable(so, hdr)
