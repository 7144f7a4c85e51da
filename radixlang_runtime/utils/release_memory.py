"""release_memory(): hand freed heap back to the OS (torch-free, stdlib only).

Python frees objects, but glibc's malloc keeps the pages: large arrays released one by one raise its
mmap threshold, so later ones come from the heap, whose free pages stay in the process's RSS until
malloc_trim. Called after a cache is emptied (/flush_cache), never on the per-step path (a trim walks
the whole heap: milliseconds to tens of milliseconds).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from typing import Optional

_libc: Optional[ctypes.CDLL] = None


def release_memory() -> bool:
    """gc.collect() + malloc_trim(0). True when glibc's trim ran (False on other C libraries)."""
    global _libc
    gc.collect()
    if _libc is None:
        name = ctypes.util.find_library("c")
        if name is None:
            return False
        _libc = ctypes.CDLL(name)
    trim = getattr(_libc, "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True
