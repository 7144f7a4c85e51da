"""Start a real launch_router process for tests and wait (bounded) until it answers /health."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import httpx
from server_utils import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEALTH_FLAGS = ["--health-check-interval-secs", "0.2", "--health-check-timeout-secs", "2",
                "--health-failure-threshold", "2", "--request-timeout-secs", "30"]
BOUND = 30.0  # the client's timeout: a routed request that hangs fails the test


class RouterProcess:
    def __init__(self, *flags: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen([sys.executable, "-m", "radixlang_runtime.launch_router", "--port",
                                      str(self.port), *flags], stdout=self.log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_for(lambda: self.ready(), 120, lambda: f"router not ready:\n{self.tail()}")
        except BaseException:
            self.stop()  # never left running behind a failed start
            raise

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"router exited {self.proc.returncode}:\n{self.tail()}")
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def info(self) -> dict:
        return httpx.get(self.url + "/server_info", timeout=BOUND).json()  # a loaded machine: seconds

    def instance(self, role: str, url: str) -> dict:
        return next(i for i in self.info()["groups"][role]["instances"] if i["url"] == url)

    def tail(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-4000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def wait_for(cond, timeout: float, what) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(what() if callable(what) else what)
