"""C kernels for the bf16 CPU path, built with the system C compiler and called through ctypes.

- decode_attention.c: paged decode attention reading K/V in place from the pool;
- extend_attention.c: extend (prefill) attention over a cached prefix read in place + the new tokens;
- norm_act.c: fused residual-add + RMSNorm, and SiLU-and-mul.
All *.c files here compile once into one library in the cache directory (keyed by the sources'
hash); a machine without a compiler falls back to the torch ops. The library links the same
libgomp.so.1 torch already loaded, so both share one OpenMP thread pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Optional

import torch

from radixlang_runtime.model.resolve import cache_root

logger = logging.getLogger(__name__)

_DIR = os.path.dirname(__file__)
_SRCS = sorted(os.path.join(_DIR, f) for f in os.listdir(_DIR) if f.endswith(".c"))
_lib: Optional[ctypes.CDLL] = None
_tried = False


def _cache_dir() -> str:
    return os.path.join(cache_root(), "kernels")


def load() -> Optional[ctypes.CDLL]:
    """The compiled library, or None when it cannot be built here (the caller falls back)."""
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    if os.environ.get("RADIXLANG_DISABLE_CPU_KERNELS") == "1":
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        logger.warning("no C compiler: the CPU path uses torch ops only")
        return None
    sources = _SRCS + [os.path.join(_DIR, "common.h")]
    digest = hashlib.sha1(b"".join(open(p, "rb").read() for p in sources)).hexdigest()[:16]
    so = os.path.join(_cache_dir(), f"cpu_kernels-{digest}.so")
    if not os.path.exists(so):
        os.makedirs(_cache_dir(), exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=_cache_dir())
        os.close(fd)
        cmd = [cc, "-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared", *_SRCS, "-o", tmp, "-lm"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            os.unlink(tmp)
            logger.warning("building the CPU kernels failed, using torch ops:\n%s", res.stderr[-2000:])
            return None
        os.replace(tmp, so)
    lib = ctypes.CDLL(so)
    fn = lib.paged_decode_bf16
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6 + [ctypes.c_float, ctypes.c_void_p]
    lib.add_rms_norm_bf16.restype = None
    lib.add_rms_norm_bf16.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2 + [ctypes.c_float]
    lib.extend_causal_bf16.restype = ctypes.c_int
    lib.extend_causal_bf16.argtypes = ([ctypes.c_void_p, ctypes.c_int64] * 3 + [ctypes.c_void_p] * 2
                                       + [ctypes.c_int64] * 4 + [ctypes.c_float, ctypes.c_void_p]
                                       + [ctypes.c_void_p] * 2 + [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
                                       + [ctypes.c_void_p] * 2)
    lib.silu_mul_bf16.restype = None
    lib.silu_mul_bf16.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2
    _lib = lib
    return _lib


def supported(q: torch.Tensor, head_dim: int, num_heads: int, num_kv_heads: int) -> bool:
    return (q.device.type == "cpu" and q.dtype == torch.bfloat16 and head_dim <= 256
            and num_heads // num_kv_heads <= 32 and load() is not None)


def paged_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, req_to_token: torch.Tensor,
                 req_rows: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, H, D] bf16; pools [Hkv, N, D]; req_to_token [rows, ctx] int64 -> out [B, H, D] bf16."""
    q = q.contiguous()
    B, H, D = q.shape
    hkv, N, _ = k_pool.shape
    out = torch.empty_like(q)
    rc = _lib.paged_decode_bf16(
        q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), req_to_token.data_ptr(),
        req_rows.data_ptr(), seq_lens.data_ptr(), B, H, hkv, D, N, req_to_token.shape[1], scale, out.data_ptr(),
    )
    if rc != 0:
        raise RuntimeError(f"paged_decode_bf16 failed with code {rc}")
    return out


def add_rms_norm(x: Optional[torch.Tensor], residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual [T, H] += x (in place, when x is given); returns rms_norm(residual) * weight. All bf16."""
    T, H = residual.shape
    out = torch.empty_like(residual)
    xp = None if x is None else x.contiguous().data_ptr()
    _lib.add_rms_norm_bf16(residual.data_ptr(), xp, weight.data_ptr(), out.data_ptr(), T, H, eps)
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] bf16 -> silu(gate) * up [T, I]."""
    T, two_i = gate_up.shape
    out = torch.empty(T, two_i // 2, dtype=gate_up.dtype)
    _lib.silu_mul_bf16(gate_up.contiguous().data_ptr(), out.data_ptr(), T, two_i // 2)
    return out


def extend_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor,
                  scale: float, prefix: Optional["PagedPrefix"] = None) -> Optional[torch.Tensor]:
    """Extend attention: new tokens attend to their cached prefix (if any) and causally to themselves.

    q [T, H, D], k / v [T, Hkv, D] bf16 (the new tokens), each with contiguous heads (row strides may
    differ); starts / lens [R] int64 -> out [T, H * D], or None where the kernel does not apply.
    prefix: where each request's first prefix_lens[r] positions live in the pool (None: no prefixes).
    """
    T, H, D = q.shape
    for t in (q, k, v):
        if t.stride(2) != 1 or t.stride(1) != D:
            return None
    out = torch.empty(T, H * D, dtype=q.dtype)
    if prefix is None:
        pool_args = (None, None, 0, None, 0, None, None)
    else:
        rt = prefix.req_to_token
        pool_args = (prefix.k_pool.data_ptr(), prefix.v_pool.data_ptr(), prefix.k_pool.shape[1], rt.data_ptr(),
                     rt.stride(0), prefix.req_rows.data_ptr(), prefix.prefix_lens.data_ptr())
    rc = _lib.extend_causal_bf16(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
                                 starts.data_ptr(), lens.data_ptr(), starts.shape[0], H, k.shape[1], D, scale,
                                 out.data_ptr(), *pool_args)
    if rc == -1:
        return None
    if rc != 0:
        raise RuntimeError(f"extend_causal_bf16 failed with code {rc}")
    return out


@dataclass
class PagedPrefix:
    """The cached prefixes of an extend batch, read in place from the pool."""

    k_pool: torch.Tensor  # [Hkv, N, D] bf16, contiguous (one layer)
    v_pool: torch.Tensor  # [Hkv, N, D]
    req_to_token: torch.Tensor  # [rows, ctx] int64, contiguous rows
    req_rows: torch.Tensor  # [R] int64
    prefix_lens: torch.Tensor  # [R] int64
