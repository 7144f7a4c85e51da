"""What trusting the hierarchical cache costs (docs/HICACHE.md): hashing the embedded model's weights (once per
load, then a sidecar), and opening one record (HMAC-SHA256 over a 32-token record of SmolLM2-135M's K/V in
2-byte floats) next to a CRC-32 of the same bytes. Best of N, seconds to milliseconds.

    python benchmarks/bench_hicache_seal.py
"""

from __future__ import annotations

import os
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's sources

from radixlang_runtime.mem.tiers.record import RecordCodec  # noqa: E402
from radixlang_runtime.mem.tiers.weights_digest import hash_file  # noqa: E402
from radixlang_runtime.model.loader.resolve import embedded_gguf_path  # noqa: E402


def best(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    path = embedded_gguf_path()
    print(f"weights digest: {os.path.getsize(path) / 1e6:.0f} MB in {best(lambda: hash_file(path), 3):.2f} s")
    n = 2 * 30 * 3 * 32 * 64 * 2  # [K/V, layers, kv_heads, record tokens, head_dim] x 2 bytes
    payload, codec, key = os.urandom(n), RecordCodec(b"k" * 32), b"x" * 16
    blob = codec.encode(key, payload)
    print(f"record of {n} bytes: HMAC-SHA256 open {best(lambda: codec.decode(key, blob), 50) * 1e3:.2f} ms, "
          f"CRC-32 {best(lambda: zlib.crc32(payload), 50) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
