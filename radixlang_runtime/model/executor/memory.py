"""Where the runner's memory goes (the KV pool's own sizing and lazy block: mem/kv_memory.py).

`breakdown` is what /server_info and Engine.get_stats() report under "memory".

Step buffers (tune_malloc, CPU runners on glibc): every step allocates and frees buffers of 1-40 MB
(logits [64, 49152] float32 is 12.6 MB, a prefill block's activations, the kernels' scratch). glibc
serves a request above its mmap threshold with a fresh mmap and returns freed heap tops to the OS
past its trim threshold; either way the next step's buffer is new pages, each a fault plus a zeroed
4 KB page, a measurable share of a run's time (more still with the mmap threshold held at glibc's
128 KB default). With allocations up to MALLOC_MMAP_THRESHOLD from the heap and up to
MALLOC_TRIM_THRESHOLD of freed heap kept, a run after the first faults mostly on the pool's first
touches, and runs faster (figures: docs/PERFORMANCE.md#memory). The cost: up to
MALLOC_TRIM_THRESHOLD of freed heap stays resident after a peak (the pool, above LAZY_BYTES, is its
own mmap either way). Settings the user gave glibc's malloc (MALLOC_*_ or GLIBC_TUNABLES in the
environment) are left alone.
"""

from __future__ import annotations

import logging
import os
import platform
import resource
from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch import nn

from radixlang_kernels import libc

MALLOC_MMAP_THRESHOLD = 64 << 20  # bytes: allocations below it come from the heap (see tune_malloc)
MALLOC_TRIM_THRESHOLD = 256 << 20  # bytes of freed heap kept before glibc gives memory back
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)

logger = logging.getLogger(__name__)


def tune_malloc() -> bool:
    """Keep the step buffers' pages between steps (module docstring): glibc's mmap and trim thresholds
    raised process-wide. True when applied; False off glibc, or when the environment already tunes
    glibc's malloc (the user's settings win)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(k.startswith("MALLOC_") for k in os.environ) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    first = libc.mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
    if first is None:
        return False
    ok = libc.mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD) is True and first
    if not ok:
        logger.warning("mallopt refused the step-buffer thresholds; glibc's defaults stay")
    return ok


def rss_bytes() -> int:
    """Resident set size now (statm), or the peak where statm is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes


@dataclass
class MemoryBreakdown:
    """Bytes. weights: parameters and buffers of the model (prepacked copies included, the tied
    embedding counted once); kv_pool: the pool's reservation (resident only where written);
    kv_touched: slots the allocator has handed out at least once x bytes per slot (an upper bound
    of the pool's resident part); table: req_to_token; available_after_warmup: MemAvailable when the
    pool was sized; rss / peak_rss: the process now and at its peak."""

    weights: int
    kv_pool: int
    kv_touched: int
    table: int
    available_after_warmup: Optional[int]
    rss: int
    peak_rss: int

    def to_dict(self) -> dict:
        return asdict(self)


def weights_bytes(model: nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    for m in model.modules():  # oneDNN-packed weights (opaque tensors), dense / q8 tiles, GGUF blocks, int8 rows
        held = [getattr(m, name, None) for name in ("packed", "tiles", "blocks", "qweight")]
        held += [b for b, _ in getattr(m, "block_parts", None) or ()]  # GGUFBlockLinear's blocks per projection
        held += getattr(m, "part_tiles", None) or []  # ... or their tiles
        for t in held:
            if not isinstance(t, torch.Tensor):
                continue
            ptr = None if t.is_mkldnn else t.data_ptr()  # a tied head shares the embedding's GGUF blocks
            if ptr is None or ptr not in seen:
                seen.add(ptr)
                total += t.numel() * t.element_size()
    return total
