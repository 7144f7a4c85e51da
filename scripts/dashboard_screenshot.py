"""Draw docs/dashboard.png from the live view of a real server under load (headless Chromium).

Starts the embedded model with the hierarchical cache (an L2 directory) and n-gram speculation, sends a few
rounds of requests that share a system prompt (some finished, some still running when the page is drawn), then
screenshots /dashboard. Usage: .venv/bin/python scripts/dashboard_screenshot.py [--out docs/dashboard.png]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx

SYSTEM = ("You are a helpful assistant for a travel agency. Answer in one short paragraph, be concrete, "
          "and name one place to visit. ") * 3
QUESTIONS = ["Where should I go in Portugal?", "What is a good city trip in Italy?", "Suggest a beach in Greece.",
             "Where can I hike in Norway?", "What should I see in Kyoto?", "Plan a day in Paris.",
             "Recommend a lake in Switzerland.", "Where to eat in Lyon?"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not become ready in time")


def ask(url: str, question: str, max_tokens: int) -> None:
    body = {"text": SYSTEM + question, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.7}}
    httpx.post(url + "/generate", json=body, timeout=300)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join("docs", "dashboard.png"))
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        raise SystemExit("no Chromium installed (apt install chromium)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    l2 = tempfile.mkdtemp(prefix="radixlang-l2-")
    proc = subprocess.Popen([sys.executable, "-m", "radixlang_runtime.launch_server", "--port", str(port),
                             "--max-total-tokens", "8192", "--enable-hierarchical-cache", "--hicache-storage-dir",
                             l2, "--hicache-write-policy", "write_through", "--speculative-algorithm", "NGRAM"])
    try:
        wait_ready(url, proc)
        for q in QUESTIONS[:4]:  # finished requests: a shared prefix in the tree, latencies in the series
            ask(url, q, 24)
        running = [threading.Thread(target=ask, args=(url, q, 160)) for q in QUESTIONS[4:]]
        for t in running:
            t.start()
        time.sleep(3)  # the page is drawn while these decode
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--no-first-run", "--disable-extensions", "--virtual-time-budget=4000",
                        f"--screenshot={os.path.abspath(args.out)}", "--window-size=1300,1000",
                        url + "/dashboard"], check=True, capture_output=True, timeout=120)
        for t in running:
            t.join(timeout=300)
        print("wrote", args.out)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        shutil.rmtree(l2, ignore_errors=True)


if __name__ == "__main__":
    main()
