"""L3's read path alone: --records KV records of --record-bytes (default: SmolLM2-135M's 32-token bf16 record)
read from a local redis-server in MGETs of --batch (hicache.L3_BATCH), by redis-py with hiredis's C reply parser
against its pure-Python parser. Each parser in a fresh process (a restart's cold connection), --passes passes
each; medians over passes of every process. Records are random bytes (no record.decode: the client alone).

    python benchmarks/bench_redis_fetch.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

CHILD = """
import json, sys, time
import redis, redis.connection as rc
url, parser, batch, passes, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cls = {"hiredis": rc._HiredisParser, "python": rc._RESP2Parser}[parser]
c = redis.Redis(connection_pool=redis.ConnectionPool.from_url(url, parser_class=cls))
keys = [f"bench:{i}" for i in range(n)]
out = []
for _ in range(passes):
    t0 = time.perf_counter()
    got = 0
    for i in range(0, n, batch):
        got += sum(len(b) for b in c.mget(keys[i:i + batch]))
    out.append(time.perf_counter() - t0)
print(json.dumps({"s": out, "bytes": got}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=124)
    ap.add_argument("--record-bytes", type=int, default=2 * 30 * 3 * 32 * 64 * 2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--processes", type=int, default=3, help="fresh processes per parser")
    a = ap.parse_args()

    import redis
    from redis_utils import RedisServer

    with tempfile.TemporaryDirectory() as tmp:
        srv = RedisServer(tmp)
        try:
            c = redis.Redis.from_url(srv.url)
            for i in range(a.records):
                c.set(f"bench:{i}", os.urandom(a.record_bytes))
            res: dict[str, list[float]] = {"hiredis": [], "python": []}
            for _ in range(a.processes):
                for parser in res:  # alternating, so drift hits both alike
                    r = subprocess.run([sys.executable, "-c", CHILD, srv.url, parser, str(a.batch), str(a.passes),
                                        str(a.records)], capture_output=True, text=True, timeout=300, check=True)
                    got = json.loads(r.stdout)
                    assert got["bytes"] == a.records * a.record_bytes, got
                    res[parser] += got["s"]
        finally:
            srv.stop()
    med = {k: statistics.median(v) for k, v in res.items()}
    mib = a.records * a.record_bytes / 2**20
    print(f"{a.records} records of {a.record_bytes} bytes ({mib:.1f} MiB), MGETs of {a.batch}, medians of "
          f"{a.processes} x {a.passes}: hiredis {med['hiredis'] * 1e3:.1f} ms, "
          f"pure Python {med['python'] * 1e3:.1f} ms ({med['python'] / med['hiredis']:.2f}x)")


if __name__ == "__main__":
    main()
