"""The KV pool's memory: how big the CPU pool is, and the one block it lives in.

Sizing (CPU, no --max-total-tokens / --kv-cache-budget-bytes): after the weights are loaded and one
warm-up prefill has run (its activations, oneDNN's primitives and scratch are then part of the
process), the pool gets `mem_fraction_static` (default 0.4) of the memory the OS reports available
(MemAvailable), capped at DEFAULT_CPU_KV_CAP when the fraction is not given, at least MIN_CPU_KV.

Lazy pages: the pool is one allocation; above LAZY_BYTES it is its own anonymous mmap (not malloc's:
a large torch.empty may be served from freed heap memory with old contents, seen in a long test run),
whose fresh pages read as zero and cost resident memory only once written. The pool used to be
zero-filled at start: the whole (then fixed, 1 GiB) pool resident before the first request, several
times the embedded model's weights (docs/PERFORMANCE.md#memory). Below LAZY_BYTES torch.zeros runs.

Imports nothing of model/ or scheduler/ (mem/ sits below both).
"""

from __future__ import annotations

import math
import mmap
from typing import Optional

import torch

DEFAULT_CPU_KV_FRACTION = 0.4
DEFAULT_CPU_KV_CAP = 4 << 30  # bytes: the pool a default start may take (vLLM-CPU's default KV space is 4 GB)
MIN_CPU_KV = 64 << 20
LAZY_BYTES = 64 << 20


def mem_available() -> Optional[int]:
    """MemAvailable from /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_kv_budget(fraction: Optional[float], available: Optional[int]) -> int:
    """Bytes for the CPU KV pool from the memory available after warm-up (see the module docstring)."""
    if available is None:
        return 1 << 30  # no /proc: the old fixed default
    budget = int(available * (fraction or DEFAULT_CPU_KV_FRACTION))
    if fraction is None:
        budget = min(budget, DEFAULT_CPU_KV_CAP)
    return max(budget, MIN_CPU_KV)


def lazy_pages(nbytes: int, device: torch.device) -> bool:
    """Whether kv_block maps a block of nbytes on device lazily (its pages resident only once written)."""
    return device.type == "cpu" and nbytes >= LAZY_BYTES


def kv_block(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One tensor for every layer's K and V: zero-filled when small, lazily zero (OS pages) when large."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if lazy_pages(nbytes, device):  # zero pages until written; the tensor keeps the map
        return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)
    return torch.zeros(shape, dtype=dtype, device=device)
