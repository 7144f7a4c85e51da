"""Start a real `launch_server` process for tests and wait until it answers /health.

`shared_server(*flags)`: one server per distinct flag list for the whole pytest session, for modules whose
tests only send requests (no kill, no signal, no flush, no fault injection, no absolute counters): a start
costs ~20 s of a 2-core CI machine. conftest.py stops them when the session ends."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, *flags: str, timeout: float = 300.0, new_session: bool = False):
        """new_session: the server leads its own session and process group (os.killpg reaches it, not pytest).
        The port comes from free_port(): another process may take it before the server binds it (a shared
        machine), so a start that fails with "address already in use" is retried on a new port, twice."""
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        for attempt in range(3):
            if self._start(flags, timeout, new_session):
                return
            if attempt < 2 and "address already in use" in self.tail().lower():
                self.log.truncate(0)
                self.log.seek(0)
                continue
            raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")

    def _start(self, flags: tuple, timeout: float, new_session: bool) -> bool:
        """True once /health answers 200; False if the process exited first."""
        named = {f.rsplit(":", 1)[1] for f in flags if isinstance(f, str) and re.fullmatch(r"[\w.\-]+:\d+", f)}
        self.port = free_port()
        while str(self.port) in named:  # never a port the flags name (--dist-init-addr HOST:PORT)
            self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "radixlang_runtime.launch_server", "--port", str(self.port), *flags]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=dict(os.environ),
                                     start_new_session=new_session)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server not healthy after {timeout} s:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-n:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


# The keyed server (float32, an API key, /metrics, the ZeroMQ link) that test_fuzz_intake and test_zmq_hostile
# share: shared_server(*KEYED_FLAGS, frontend=True).
KEYED_KEY = "keyed-test-key"
KEYED_FLAGS = ("--dtype", "float32", "--max-total-tokens", "4096", "--api-key", KEYED_KEY, "--enable-metrics")

# The float32 server of the embedded model that read-only modules share (test_openai_agents, test_regex_bombs).
FP32_FLAGS = ("--dtype", "float32", "--max-total-tokens", "8192")
# The float32 deepseek-r1 reasoning server (every output starts inside the reasoning block) that the reasoning
# watch and Responses reasoning modules share; the overlap schedule on, so watched requests step one by one.
R1_FLAGS = ("--dtype", "float32", "--max-total-tokens", "4096", "--reasoning-parser", "deepseek-r1",
            "--enable-overlap-schedule")
# The server the cache_salt and return_hidden_states modules share: the overlap schedule on, and prefill chunks of
# two pages, so a prompt of a few dozen tokens prefills in several chunks.
HIDDEN_FLAGS = ("--dtype", "float32", "--max-total-tokens", "4096", "--enable-overlap-schedule",
                "--chunked-prefill-size", "32", "--enable-return-hidden-states", "--debug-check-integrity")

_SHARED: dict[tuple, ServerProcess] = {}


def shared_server(*flags: str, frontend: bool = False) -> ServerProcess:
    """The session's server for exactly these flags (started on first use). frontend=True adds a
    --frontend-port of its own (the DSL's ZeroMQ link): srv.frontend_port, srv.frontend ("tcp://...").
    A shared server that has exited is an error (a module broke the contract above), not restarted."""
    key = (flags, frontend)
    srv = _SHARED.get(key)
    if srv is not None:
        assert srv.proc.poll() is None, f"the shared server {flags} exited ({srv.proc.returncode}):\n{srv.tail()}"
        return srv
    port = free_port() if frontend else None
    srv = ServerProcess(*flags, *(("--frontend-port", str(port)) if frontend else ()))
    if frontend:
        srv.frontend_port, srv.frontend = port, f"tcp://127.0.0.1:{port}"
    _SHARED[key] = srv
    return srv


def stop_shared_servers() -> list[str]:
    """Stops every shared server; returns a line for each that did not exit cleanly (0, or 143: uvicorn
    re-raises SIGTERM after its graceful shutdown)."""
    bad = []
    while _SHARED:
        flags, srv = _SHARED.popitem()
        code = srv.stop()
        if code not in (0, 143):
            bad.append(f"shared server {flags} exited with {code}:\n{srv.tail()}")
    return bad


# ---- checks shared by the server tests
# a scheduler's get_stats, as ServerMetrics reads it (metrics tests render it without a server)
STATS = dict(num_running_reqs=3, num_waiting_reqs=2, total_slots=100, free_slots=50, evictable_slots=10,
             prefill_tokens_cached=2, prefill_tokens_computed=6, num_retractions=1, new_token_ratio=0.5)

def stats(client) -> dict:
    return client.get("/server_info").json()["stats"]


def assert_idle_and_whole(client, timeout: float = 20) -> None:
    deadline = time.time() + timeout
    while True:
        st = stats(client)
        if st["num_running_reqs"] == 0 and st["num_waiting_reqs"] == 0:
            break
        assert time.time() < deadline, st
        time.sleep(0.05)
    assert st["free_slots"] + st["cached_slots"] == st["total_slots"], st
    assert st["evictable_slots"] == st["cached_slots"], st


def sse_events(lines) -> list:
    events = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has exited; it only waits for its parent to read its status
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while any(alive(p) for p in pids):
        assert time.time() < deadline, f"still running: {[p for p in pids if alive(p)]}"
        time.sleep(0.1)
