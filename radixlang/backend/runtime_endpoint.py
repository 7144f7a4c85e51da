"""`RuntimeEndpoint(url)` (an http(s) URL: the server's ZeroMQ link when it has one, see discover.py;
tcp:// / ipc://: that link) and `Runtime(**server_args)`, a server started as a child process and
reached over its ZeroMQ frontend socket (found through its HTTP URL).

Runtime invariants: the child is `python -m radixlang_runtime.launch_server` in its own process,
started with PR_SET_PDEATHSIG on Linux so it dies with this process even on SIGKILL (NOTE: the signal
follows the creating *thread*: create a Runtime on a thread that outlives it, e.g. the main one); readiness is
waited for with a bound (`launch_timeout`), and a child that exits early fails the constructor with
the tail of its log; `shutdown()` (also at exit and on `with` exit) terminates it, then kills it
after a bound — launch_server stops its own scheduler and detokenizer on SIGTERM, so nothing is orphaned.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any, Optional

from radixlang.backend.base import BaseBackend


def RuntimeEndpoint(base_url: str, api_key: Optional[str] = None, verify: Any = None,
                    chat_template_name: Optional[str] = None, timeout: Optional[float] = None,
                    link: str = "auto") -> BaseBackend:
    """http(s)://host:port → the server; tcp://host:port (or ipc://) → its ZeroMQ link directly.
    For an http(s) URL, `link` picks the transport (discover.py): "auto" runs programs over the server's
    ZeroMQ link when it reports one and answers, else over HTTP; "http" always HTTP (tests, benchmarks);
    "zmq" the link or a BackendError naming why not. `backend.transport` says which was chosen.
    An http(s) URL with no server behind it raises UnreachableError (radixlang.errors) at once, naming it."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://", "tcp://", "ipc://")):
        raise ValueError(f"not a server URL: {base_url!r} (use http(s)://host:port, or tcp://host:port "
                         "/ ipc://path for the ZeroMQ link)")
    from radixlang.backend.discover import LINKS, choose_link

    if link not in LINKS:
        raise ValueError(f"link must be one of {', '.join(LINKS)}; got {link!r}")
    if base_url.startswith(("tcp://", "ipc://")):
        if link == "http":
            raise ValueError(f"link='http' needs an http(s):// URL; got {base_url!r}")
        from radixlang.backend.zmq import ZmqBackend

        return ZmqBackend(base_url, api_key=api_key, chat_template_name=chat_template_name, timeout=timeout)
    from radixlang.backend.http import HttpBackend

    http = HttpBackend(base_url, api_key=api_key, verify=verify, chat_template_name=chat_template_name,
                       timeout=timeout)
    return choose_link(http, link, chat_template_name, timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _flags(server_args: dict) -> list[str]:
    out = []
    for k, v in server_args.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        elif v not in (None, False):
            out += [flag, str(v)]
    return out


class Runtime:
    def __init__(self, log_level: str = "error", launch_timeout: float = 600.0,
                 chat_template_name: Optional[str] = None,
                 **server_args: Any):
        host = server_args.pop("host", None) or "127.0.0.1"
        port = server_args.pop("port", None) or _free_port()
        self.api_key = server_args.get("api_key")
        self.url = f"http://{host}:{port}"
        self.frontend_url: Optional[str] = None  # the ZeroMQ link's tcp:// address, once connected
        self.endpoint: Optional[BaseBackend] = None
        self.log = tempfile.NamedTemporaryFile("w+", prefix="radixlang-runtime-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "radixlang_runtime.launch_server", "--host", host, "--port", str(port),
               "--log-level", log_level, *_flags(server_args)]  # frontend_port, if given, among them
        self.proc: Optional[subprocess.Popen] = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env=dict(os.environ),
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        self.pid = self.proc.pid
        atexit.register(self.shutdown)
        try:
            self._wait_ready(launch_timeout)
            link = "http" if server_args.get("frontend_port") == -1 else "zmq"  # the link the server reports
            self.endpoint = RuntimeEndpoint(self.url, api_key=self.api_key, chat_template_name=chat_template_name,
                                            link=link)
            self.frontend_url = self.endpoint.base_url if link == "zmq" else None
        except BaseException:
            self.shutdown()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode} before it was ready:\n"
                                   f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        raise TimeoutError(f"the server was not ready within {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        try:
            with open(self.log.name, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def shutdown(self) -> None:
        if self.endpoint is not None:
            self.endpoint.shutdown()
            self.endpoint = None
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        atexit.unregister(self.shutdown)

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:
        if self.__dict__.get("proc") is not None:
            self.shutdown()

    # SGLang's Runtime conveniences
    def cache_prefix(self, prefix: str) -> None:
        self.endpoint.cache_prefix(prefix)

    def flush_cache(self) -> Any:
        return self.endpoint.flush_cache()

    def get_server_info(self) -> Any:
        return self.endpoint.get_server_info()

    def get_chat_template(self) -> Any:
        return self.endpoint.get_chat_template()

    def generate(self, prompt: Any, sampling_params: Optional[dict] = None, **kwargs: Any) -> str:
        """SGLang's Runtime.generate: the /generate answer as a JSON string."""
        return json.dumps(self.endpoint._call({"text": prompt, "sampling_params": sampling_params or {}, **kwargs}))
