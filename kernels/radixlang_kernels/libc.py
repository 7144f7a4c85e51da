"""The C library calls the runtime makes, typed once (torch-free): with the kernel library (op_table), the
whole of the project's foreign-function boundary lives in this package.

- prctl(PR_SET_PDEATHSIG): a child process dies with the parent thread that started it (child_process.py);
- mallopt: glibc's malloc thresholds (model/executor/memory.py);
- madvise(MADV_POPULATE_WRITE): KV pages faulted in ahead of use (mem/kv_prefault.py); ctypes releases
  the GIL during the call;
- malloc_trim: freed heap pages handed back to the OS (utils/release_memory.py).
Each returns a plain result; where the call does not exist (no libc found) it says so (None / False).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from typing import Optional

PR_SET_PDEATHSIG = 1


@functools.lru_cache(maxsize=1)
def _libc() -> Optional[ctypes.CDLL]:
    """Linux: the process's own symbols (libc's among them; no ldconfig lookup); elsewhere find_library."""
    name = None if sys.platform.startswith("linux") else ctypes.util.find_library("c")
    if name is None and not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.madvise.restype = ctypes.c_int
    return lib


def set_parent_death_signal(sig: int) -> bool:
    """prctl(PR_SET_PDEATHSIG, sig) for this process (Linux); True when set."""
    lib = _libc()
    return lib is not None and lib.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def mallopt(param: int, value: int) -> Optional[bool]:
    """glibc's mallopt(param, value): True when applied, False when refused, None without a libc."""
    lib = _libc()
    return None if lib is None else lib.mallopt(param, value) == 1


def madvise_available() -> bool:
    return _libc() is not None


def madvise(addr: int, length: int, advice: int) -> int:
    """madvise(addr, length, advice): 0, or the errno of the failure (see os.strerror)."""
    lib = _libc()
    if lib is None:
        raise OSError("no C library found for madvise")
    return 0 if lib.madvise(addr, length, advice) == 0 else ctypes.get_errno()


def malloc_trim() -> bool:
    """glibc's malloc_trim(0); True when it ran (False where the C library has none)."""
    lib = _libc()
    trim = getattr(lib, "malloc_trim", None) if lib is not None else None
    if trim is None:
        return False
    trim(0)
    return True
