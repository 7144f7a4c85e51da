"""/health latency while one thread floods the DSL's ZeroMQ port (docs/DSL_LINK.md, "Measured").

    .venv/bin/python benchmarks/bench_zmq_flood.py --seconds 15

starts a keyed server (the embedded model, float32, CPU, --frontend-port 0), polls /health every 50 ms for
--seconds without a flood (the machine's own noise), then as long again while a child process sends random
bytes, key-less pings and model_info with a wrong key in turn, from one thread, as fast as the link takes
them. Prints max / p99 / median per phase and the messages sent.

    .venv/bin/python benchmarks/bench_zmq_flood.py --flood tcp://127.0.0.1:PORT SECONDS

is the flooder alone (tests/server/test_zmq_flood.py runs it against the test server); it prints the messages sent.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "bench-flood-key"


def flood(address: str, seconds: float) -> int:
    import zmq

    from radixlang_runtime.protocol import messages as m

    rng = random.Random(5)
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDTIMEO, 100)
    s.connect(address)
    kinds = [lambda i: rng.randbytes(rng.randrange(1, 200)),
             lambda i: m.encode(m.FrontendReq(f"p{i}", "ping", None, None)),
             lambda i: m.encode(m.FrontendReq(f"w{i}", "model_info", None, "wrong-key"))]
    sent, i, end = 0, 0, time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            s.send(kinds[i % 3](i))
            sent += 1
        except zmq.Again:
            pass
        i += 1
        if i % 64 == 0:
            while s.poll(0):  # read what came back, so replies never back up into the server
                s.recv()
    s.close(0)
    ctx.term()
    return sent


def start_flood(address: str, seconds: float) -> subprocess.Popen:
    """The flooder in a process of its own (its work shares no interpreter with whoever measures)."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--flood", address, str(seconds)],
                            stdout=subprocess.PIPE, text=True, env=env)


def poll_health(url: str, until) -> list[float]:
    import httpx

    out = []
    with httpx.Client(timeout=60) as http:
        while until():
            t0 = time.perf_counter()
            r = http.get(url + "/health")
            out.append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise RuntimeError(f"/health answered {r.status_code}: {r.text}")
            time.sleep(0.05)
    return out


def summary(xs: list[float]) -> str:
    from bench_common import percentile

    return (f"/health x{len(xs)}: max {max(xs) * 1e3:.1f} ms, p99 {percentile(xs, 0.99) * 1e3:.1f} ms, "
            f"median {percentile(xs, 0.5) * 1e3:.1f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--flood", nargs=2, metavar=("ADDRESS", "SECONDS"), help="only flood ADDRESS for SECONDS")
    args = p.parse_args()
    if args.flood:
        print(flood(args.flood[0], float(args.flood[1])))
        return
    import httpx

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from server_utils import ServerProcess

    srv = ServerProcess("--dtype", "float32", "--api-key", KEY, "--frontend-port", "0")
    try:
        info = httpx.get(srv.url + "/server_info", headers={"Authorization": f"Bearer {KEY}"}, timeout=60).json()
        address = info["frontend"]["address"]
        end = time.monotonic() + args.seconds
        print("no flood:", summary(poll_health(srv.url, lambda: time.monotonic() < end)))
        proc = start_flood(address, args.seconds)
        time.sleep(0.5)
        lat = poll_health(srv.url, lambda: proc.poll() is None)
        print(f"flood {args.seconds:g} s, {int(proc.communicate()[0])} messages:", summary(lat))
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
