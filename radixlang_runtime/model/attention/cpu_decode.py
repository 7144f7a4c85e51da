"""Build and call cpu_decode.c (paged bf16 decode attention) through ctypes.

The C file is compiled once with the system C compiler into the cache directory (keyed by the
source hash); a machine without a compiler falls back to the torch path. The library links the
same libgomp.so.1 torch already loaded, so both share one OpenMP thread pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from typing import Optional

import torch

logger = logging.getLogger(__name__)

_SRC = os.path.join(os.path.dirname(__file__), "cpu_decode.c")
_lib: Optional[ctypes.CDLL] = None
_tried = False


def _cache_dir() -> str:
    base = os.environ.get("RADIXLANG_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "radixlang")
    return os.path.join(base, "kernels")


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
        logger.warning("no C compiler: CPU decode attention uses the torch path")
        return None
    src = open(_SRC, "rb").read()
    so = os.path.join(_cache_dir(), f"cpu_decode-{hashlib.sha1(src).hexdigest()[:16]}.so")
    if not os.path.exists(so):
        os.makedirs(_cache_dir(), exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=_cache_dir())
        os.close(fd)
        cmd = [cc, "-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared", _SRC, "-o", tmp, "-lm"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            os.unlink(tmp)
            logger.warning("building cpu_decode.c failed, using the torch path:\n%s", res.stderr[-2000:])
            return None
        os.replace(tmp, so)
    lib = ctypes.CDLL(so)
    fn = lib.paged_decode_bf16
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6 + [ctypes.c_float, ctypes.c_void_p]
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
