"""How long a non-streaming request outlives its client, and what the time is made of.

Starts a server (`--log-level debug`), then per try: a raw socket POSTs a long request, the script waits until
the scheduler runs it, lets it decode a while, closes the socket and records the time. Three figures per try,
from the close:
  http   the handler saw `http.disconnect` and had cancelled the request (its `finally` sent the abort):
         the server log's "client disconnected" line (server/client_watch.py);
  sched  the scheduler dropped the request and freed its KV: the scheduler log's "aborted by request" line
         (the abort is taken at the start of the scheduler's next step);
  polled /server_info first reports no running request (adds a poll's round trip through the scheduler);
  step   from the last poll before the close to the abort, per forward step completed in between (one: the abort
         was taken at the first step boundary, and this is the step in flight; without --busy).
--busy N keeps N streaming requests decoding beside it (longer steps). Log times have millisecond resolution.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_disconnect.py --tries 5 --busy 4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime

import httpx

LONG = 4000
BODIES = {
    "/generate": {"text": "Count slowly:", "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True}},
    "/v1/completions": {"model": "default", "prompt": "Count slowly:", "max_tokens": LONG, "ignore_eos": True},
    "/v1/chat/completions": {"model": "default", "messages": [{"role": "user", "content": "Count slowly."}],
                             "max_tokens": LONG, "ignore_eos": True},
}
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) DEBUG (.*)$")


def _start(port: int, log) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "radixlang_runtime.launch_server", "--port", str(port), "--max-total-tokens",
           "8192", "--log-level", "debug"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    deadline = time.time() + 600
    while time.time() < deadline:
        assert proc.poll() is None, "server exited"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("server did not start")


def _stats(url: str) -> dict:
    return httpx.get(url + "/server_info", timeout=60).json()["stats"]


def _running(url: str) -> int:
    return _stats(url)["num_running_reqs"]


def _events(log_path: str, after: float) -> dict[str, float]:
    """First "client disconnected" (http) and "aborted by request" (sched) log times after `after`."""
    found: dict[str, float] = {}
    with open(log_path, errors="replace") as f:
        for line in f:
            m = _STAMP.match(line)
            if not m:
                continue
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if t < after - 0.002:  # log times are truncated to the millisecond
                continue
            if "client disconnected" in m.group(3):
                found.setdefault("http", t)
            elif "aborted by request" in m.group(3):
                found.setdefault("sched", t)
    return found


def _try(url: str, path: str, busy: int, log_path: str) -> dict[str, float]:
    host, port = url.rsplit("/", 1)[-1].split(":")
    body = json.dumps(BODIES[path]).encode()
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    t0 = time.monotonic()
    while _running(url) < busy + 1:
        assert time.monotonic() - t0 < 120, "the request never ran"
        time.sleep(0.02)
    time.sleep(0.3)
    s0, t0 = _stats(url)["forward_steps"], time.time()
    closed, closed_mono = time.time(), time.monotonic()
    sock.close()
    while (stats := _stats(url))["num_running_reqs"] > busy:
        assert time.monotonic() - closed_mono < 60, "still running after the client left"
        time.sleep(0.02)
    polled = time.monotonic() - closed_mono
    steps = max(1, stats["forward_steps"] - s0)  # none after the abort: nothing else runs (without --busy)
    time.sleep(0.2)  # the log lines reach the file
    ev = _events(log_path, closed)
    step = (ev.get("sched", float("nan")) - t0) / steps
    return {"http": ev.get("http", float("nan")) - closed, "sched": ev.get("sched", float("nan")) - closed,
            "polled": polled, "step": step}


def _busy_stream(url: str, stop: threading.Event) -> None:
    body = {"text": "Tell a long story:", "stream": True,
            "sampling_params": {"max_new_tokens": 100000, "ignore_eos": True}}
    with httpx.stream("POST", url + "/generate", json=body, timeout=600) as r:
        for _ in r.iter_lines():
            if stop.is_set():
                return


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tries", type=int, default=3, help="per route")
    ap.add_argument("--busy", type=int, default=0, help="streaming requests decoding beside it")
    args = ap.parse_args()
    port = 30000 + os.getpid() % 20000
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = _start(port, log)
    url = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    streams = [threading.Thread(target=_busy_stream, args=(url, stop), daemon=True) for _ in range(args.busy)]
    try:
        for t in streams:
            t.start()
        rows: dict[str, list[float]] = {"http": [], "sched": [], "polled": [], "step": []}
        for path in BODIES:
            for _ in range(args.tries):
                r = _try(url, path, args.busy, log.name)
                print(f"{path:22s} http {r['http']:.3f} s  sched {r['sched']:.3f} s  polled {r['polled']:.3f} s  "
                      f"step {r['step']:.3f} s",
                      flush=True)
                for k in rows:
                    rows[k].append(r[k])
        for k, xs in rows.items():
            print(f"{k:6s}: median {statistics.median(xs):.3f} s, max {max(xs):.3f} s over {len(xs)} tries")
        print(f"load average: {os.getloadavg()}")
    finally:
        stop.set()
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
