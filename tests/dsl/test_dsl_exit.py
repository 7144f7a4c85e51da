"""The DSL never hangs at exit, and says at once when no server is there.

- A program that raises (a missing variable, gens still running on the worker) exits by itself:
  fresh interpreters against one real server, over HTTP and ZeroMQ. Before the fix most of them hung
  in Py_Finalize: the garbage collector ran ProgramState.__del__ -> end(), which blocked forever on the
  state's lock, held by a daemon worker that the exit froze.
- `__del__` with the lock held elsewhere returns at once (fake backend); explicit end() is bounded.
- An HTTP URL with no server behind it raises UnreachableError naming it, within seconds."""

from __future__ import annotations

import gc
import http.server
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

import radixlang as sgl
from radixlang.backend import http as http_backend
from radixlang.backend.fake import FakeBackend
from radixlang.errors import BackendError, ProgramError, UnreachableError
from radixlang.global_config import global_config
from server_utils import ServerProcess, free_port

RUNS_PER_LINK = 10
EXIT_BOUND_S = 60  # one run needs a few seconds; the bug never exits

PROGRAM = textwrap.dedent("""
    import sys
    import radixlang as sgl

    sgl.set_default_backend(sgl.RuntimeEndpoint(sys.argv[1], link=sys.argv[3]))

    @sgl.function
    def prog(s):
        s += "Count to ten:" + sgl.gen("x", max_tokens=12, temperature=0)
        s += " Again:" + sgl.gen("z", max_tokens=12, temperature=0)

    st = prog.run(stream=sys.argv[2] == "stream")
    st["y"]  # never set: KeyError while the worker is busy with x / z
""")


@pytest.fixture(scope="module")
def server():
    fport = free_port()
    srv = ServerProcess("--dtype", "float32", "--max-total-tokens", "4096", "--frontend-port", str(fport))
    srv.frontend_url = f"tcp://127.0.0.1:{fport}"
    yield srv
    srv.stop()


@pytest.mark.parametrize("link", ["http", "zmq"])
def test_a_program_that_raises_exits_by_itself(server, link, tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    url = server.url if link == "http" else server.frontend_url
    here = os.path.dirname(os.path.dirname(os.path.abspath(sgl.__file__)))  # this radixlang, first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    for i in range(RUNS_PER_LINK):
        mode = "stream" if i % 2 else "plain"
        try:
            out = subprocess.run([sys.executable, str(script), url, mode, "http" if link == "http" else "auto"],
                                 capture_output=True, text=True, timeout=EXIT_BOUND_S, env=env)
        except subprocess.TimeoutExpired:
            pytest.fail(f"run {i} ({link}, {mode}) did not exit within {EXIT_BOUND_S} s")
        assert out.returncode == 1, out.stderr[-2000:]
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("KeyError:") and "'y'" in last, out.stderr[-2000:]


# ---------------------------------------------------------------------- fake backend (no model)
@sgl.function
def two_gens(s):
    s += "Q:" + sgl.gen("a", max_tokens=4)
    s += " R:" + sgl.gen("b", max_tokens=4)


def hold_lock(exe):
    """Another thread takes the state's lock and keeps it (a daemon worker frozen by the exit)."""
    taken, release = threading.Event(), threading.Event()

    def hold():
        with exe.cond:
            taken.set()
            release.wait(30)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert taken.wait(5)
    return release, t


def test_del_returns_at_once_while_another_thread_holds_the_lock():
    st = two_gens.run(backend=FakeBackend(delay=0.3))  # the worker is busy with "a"
    exe = st.stream_executor
    release, holder = hold_lock(exe)
    done = threading.Event()

    def collect():
        nonlocal st
        del st
        gc.collect()
        done.set()

    threading.Thread(target=collect, daemon=True).start()
    try:
        assert done.wait(2), "ProgramState.__del__ blocked on the state's lock"
        assert exe._ended
    finally:
        release.set()
    holder.join(5)
    exe._worker.join(10)  # the worker finishes the queue, then sees the end (within its idle poll)
    assert not exe._worker.is_alive() and exe.is_finished
    assert exe.variables["a"] == " ok" and exe.variables["b"] == " ok"


def test_explicit_end_waits_for_the_lock_within_the_bound(monkeypatch):
    st = two_gens.run(backend=FakeBackend(delay=0.3))
    exe = st.stream_executor
    monkeypatch.setattr(global_config, "wait_timeout", 0.5)
    release, holder = hold_lock(exe)
    try:
        with pytest.raises(TimeoutError, match="lock"):  # the 0.5 s bound's error, while the lock is held
            exe.end()
    finally:
        release.set()
        monkeypatch.undo()
    holder.join(5)
    exe.end()  # the lock is free: ends at once
    assert st.text() == "Q: ok R: ok"


def test_the_missing_variable_error_names_it_and_lists_the_others():
    @sgl.function
    def prog(s):
        s += "Q:" + sgl.gen("a", max_tokens=2)
        s["b"] = "set"
        s += " R:" + sgl.gen("c", max_tokens=2)

    st = prog.run(backend=FakeBackend(delay=0.3))
    with pytest.raises(KeyError) as e:
        st["y"]
    msg = str(e.value)
    assert "'y'" in msg and "the variables are: 'b'" in msg and "still to come: 'a', 'c'" in msg, msg
    st.sync()
    with pytest.raises(KeyError) as e:
        st["y"]
    assert str(e.value).endswith("the variables are: 'b', 'a', 'c'\""), str(e.value)


def test_a_failing_batch_item_cancels_the_queued_ones():
    fake = FakeBackend(delay=0.05)

    @sgl.function
    def item(s, i):
        s += f"{i}:" + sgl.gen("a", max_tokens=2)
        if i == 0:
            raise ValueError("item 0 fails")
        s["a"]

    with pytest.raises(ValueError, match="item 0 fails"):
        item.run_batch([{"i": i} for i in range(40)], backend=fake, num_threads=1)
    assert len(fake.requests) <= 3, len(fake.requests)  # item 0, maybe the one after it; not all 40


# ---------------------------------------------------------------------- no server at the URL
def test_a_dead_port_raises_at_once_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"  # bound then closed: nothing listens
    with pytest.raises(UnreachableError, match=re.escape("cannot reach " + url)) as e:
        sgl.RuntimeEndpoint(url)
    assert isinstance(e.value, ConnectionError) and isinstance(e.value, BackendError)
    assert "connection refused" in str(e.value)  # the refusal itself, not a timeout


def test_an_unknown_host_and_a_bad_url_are_named():
    with pytest.raises(UnreachableError, match="unknown host 'no-such-host.invalid'"):
        sgl.RuntimeEndpoint("http://no-such-host.invalid:30000")
    with pytest.raises(ValueError, match="not a server URL: '127.0.0.1:30000'"):
        sgl.RuntimeEndpoint("127.0.0.1:30000")


def test_a_server_that_never_accepts_fails_at_the_connect_timeout(monkeypatch):
    monkeypatch.setattr(http_backend, "CONNECT_TIMEOUT_S", 1.0)
    monkeypatch.setattr(global_config, "request_timeout", 30.0)  # the bug: a connect waited this long
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(0)  # never accepted: once the backlog is full, the kernel drops new SYNs
        port = srv.getsockname()[1]
        fillers = []
        try:
            for _ in range(8):
                c = socket.socket()
                fillers.append(c)
                c.settimeout(0.5)
                try:
                    c.connect(("127.0.0.1", port))
                except (TimeoutError, OSError):
                    break
            else:
                pytest.fail("the listen backlog never filled up")
            # the connect bound's error (the bug waited request_timeout, 30 s, and failed otherwise)
            with pytest.raises(UnreachableError, match=f"no connection to 127.0.0.1:{port} within 1 s"):
                http_backend.HttpBackend(f"http://127.0.0.1:{port}")
        finally:
            for c in fillers:
                c.close()


class OneShotInfo(http.server.BaseHTTPRequestHandler):  # HTTP/1.0: one request per connection
    def do_GET(self):
        data = b'{"model_path": "/models/SmolLM2-135M-Instruct"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_a_server_gone_between_calls_fails_the_program_naming_the_url():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OneShotInfo)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    backend = http_backend.HttpBackend(url)
    srv.shutdown()
    srv.server_close()
    st = two_gens.run(backend=backend)
    with pytest.raises(ProgramError, match=re.escape("cannot reach " + url)):
        st["a"]
    assert isinstance(st.error(), UnreachableError)
