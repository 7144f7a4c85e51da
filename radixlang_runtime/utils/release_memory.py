"""release_memory(): hand freed heap back to the OS (torch-free).

Python frees objects, but glibc's malloc keeps the pages: large arrays released one by one raise its
mmap threshold, so later ones come from the heap, whose free pages stay in the process's RSS until
malloc_trim. Called after a cache is emptied (/flush_cache), never on the per-step path (a trim walks
the whole heap: milliseconds to tens of milliseconds).
"""

from __future__ import annotations

import gc

from radixlang_kernels.libc import malloc_trim


def release_memory() -> bool:
    """gc.collect() + malloc_trim(0). True when glibc's trim ran (False on other C libraries)."""
    gc.collect()
    return malloc_trim()
