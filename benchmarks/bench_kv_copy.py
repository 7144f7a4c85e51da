"""Copying KV records into the pool: one transposing copy of all records (unpack_records + one index_copy_)
against KVRecordPort's own path (one index_copy_ a record for multi-token records; for one-token records a
strided copy per run of consecutive slots), medians of --runs. Slots: shuffled pages of --page-size.

  python benchmarks/bench_kv_copy.py            # SmolLM2-135M's KV shape, bf16, the tiers' 32-token records
  python benchmarks/bench_kv_copy.py --tokens 1 --records 2000   # PD's one-token records
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from radixlang_runtime.mem.kv_pool import KVPool
from radixlang_runtime.mem.kv_records import KVRecordPort, pack_records, unpack_records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32, help="tokens a record")
    ap.add_argument("--records", type=int, default=124)
    ap.add_argument("--slots", type=int, default=40000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--page-size", type=int, default=16, help="slots: shuffled pages of this size")
    a = ap.parse_args()
    pool = KVPool(a.slots, a.layers, a.kv_heads, a.head_dim, torch.bfloat16, torch.device("cpu"), 1, a.slots)
    pool.block.fill_(1)  # every page touched: the copies, not first-touch faults, are timed
    port = KVRecordPort(pool, a.tokens)
    kv = torch.randn(2, a.layers, a.kv_heads, a.records * a.tokens, a.head_dim).to(torch.bfloat16)
    payloads = pack_records(kv, a.tokens)  # finite values: torch.equal checks the result
    n_pages = -(-a.records * a.tokens // a.page_size)
    pages = list(range(1, a.slots // a.page_size))
    random.Random(0).shuffle(pages)
    slots = [p * a.page_size + j for p in pages[:n_pages] for j in range(a.page_size)][:a.records * a.tokens]

    def transposing() -> None:
        kv = unpack_records(b"".join(payloads), a.records, port.shape, torch.bfloat16)
        pool.block.index_copy_(3, torch.tensor(slots), kv)

    joined = b"".join(payloads)

    def port_path() -> None:  # PD writes one-token records joined (its chunks), the tiers record by record
        if a.tokens == 1:
            port.write_joined(slots, joined)
        else:
            port.write_records(slots, payloads)

    times: dict[str, list[float]] = {"transposing": [], "port": []}
    for _ in range(a.runs):
        for name, f in (("transposing", transposing), ("port", port_path)):
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
    assert torch.equal(pool.block[:, :, :, slots], kv), "the K/V written is not the records'"
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{a.records} records x {a.tokens} tokens ({a.records * port.record_bytes / 2**20:.1f} MiB), "
          f"medians of {a.runs}: transposing {med['transposing'] * 1e3:.1f} ms, port {med['port'] * 1e3:.1f} ms "
          f"({med['transposing'] / med['port']:.2f}x)")


if __name__ == "__main__":
    main()
