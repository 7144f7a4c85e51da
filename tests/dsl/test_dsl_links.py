"""The HTTP and ZeroMQ links against stub servers (no model): refusals, dropped connections and a
server that goes silent all end the program state with an exception within seconds. RuntimeEndpoint's
choice of link (discover.py): an advertised link that refuses or never answers falls back to HTTP
within its bound, saying so; the link is reached at the URL's host."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import zmq

import radixlang as sgl
from radixlang.backend.http import HttpBackend
from radixlang.backend.zmq import ZmqBackend
from radixlang.errors import BackendError, ProgramError
from radixlang_runtime.protocol import messages as m

RESULT = {"text": " hi", "output_ids": [1], "meta_info": {"prompt_tokens": 3, "finish_reason": {"type": "length"}}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _json(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.headers.get("Authorization") != "Bearer k":
            return self._json(401, {"error": {"message": "bad key"}})
        self._json(200, {"model_path": "/models/SmolLM2-135M-Instruct"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = body.get("text")
        if text == "refuse":
            return self._json(400, {"error": {"message": "top_p must be in (0, 1]"}})
        if text == "drop":
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if not body.get("stream"):
            return self._json(200, RESULT)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i, piece in enumerate([" a", " a b", " a b c"]):
            if text == "stream-drop" and i == 2:
                self.close_connection = True
                return
            self.wfile.write(b"data: " + json.dumps({"text": piece, "meta_info": {}}).encode() + b"\n\n")
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


@pytest.fixture(scope="module")
def http_url():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@sgl.function
def one_gen(s, prompt):
    s += prompt + sgl.gen("a", max_tokens=4)


def test_http_link_generates_streams_and_guesses_the_template(http_url):
    b = HttpBackend(http_url, api_key="k")
    assert b.get_chat_template().name == "chatml"  # from the model path (no chat_template reported)
    assert one_gen.run(prompt="x", backend=b)["a"] == " hi"
    st = one_gen.run(prompt="x", backend=b, stream=True)
    assert list(st.text_iter("a")) and st["a"] == " a b c"


def test_http_link_wrong_key_is_a_clear_error(http_url):
    with pytest.raises(BackendError, match="401"):
        HttpBackend(http_url, api_key="wrong")


@pytest.mark.parametrize("prompt,needle", [("refuse", "top_p"), ("drop", "connection"), ("stream-drop", "closed")])
def test_http_link_failures_end_the_state(http_url, prompt, needle):
    b = HttpBackend(http_url, api_key="k")
    st = one_gen.run(prompt=prompt, backend=b, stream=prompt == "stream-drop")
    with pytest.raises(ProgramError, match=needle):  # the failure itself, not the wait bound's TimeoutError
        st["a"]


def test_http_link_unreachable_server_fails_fast():
    with pytest.raises(BackendError, match="cannot reach"):
        HttpBackend("http://127.0.0.1:9")


def stub_router(silent_after: float):
    """Answers pings and model_info, then goes silent (a killed server) after `silent_after` s."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def serve():
        t0 = time.monotonic()
        while not stop.is_set():
            if not sock.poll(100):
                continue
            ident, data = sock.recv_multipart()
            req = m.decode(data)
            if time.monotonic() - t0 > silent_after:
                continue
            if req.method == "model_info":
                sock.send_multipart([ident, m.encode(m.FrontendOut(req.req_id, 200, {"model_path": "x"}))])
            elif req.method == "ping":
                sock.send_multipart([ident, m.encode(m.FrontendOut(req.req_id, 200, "pong"))])
            # generate: never answered
        sock.close(0)

    threading.Thread(target=serve, daemon=True).start()
    return f"tcp://127.0.0.1:{port}", stop


def test_zmq_link_detects_a_silent_server_within_seconds():
    url, stop = stub_router(silent_after=1.0)
    try:
        b = ZmqBackend(url, dead_after=1.5)
        st = one_gen.run(prompt="x", backend=b)
        with pytest.raises(ProgramError, match="stopped answering"):  # the liveness check, not the wait bound
            st["a"]
        b.shutdown()
    finally:
        stop.set()


def test_zmq_link_nobody_listening_fails_the_constructor():
    with pytest.raises(BackendError, match="no radixlang server answers at tcp://127.0.0.1:9 "):
        ZmqBackend("tcp://127.0.0.1:9", dead_after=1.0)


# ---------------------------------------------------------------------- RuntimeEndpoint's choice of link
class AdvertisingHandler(Handler):
    """Handler whose /get_model_info reports the ZeroMQ link's port the test sets in `port`."""

    port = None

    def do_GET(self):
        self._json(200, {"model_path": "/models/SmolLM2-135M-Instruct", "frontend_port": type(self).port})


@pytest.fixture
def advertising_url():
    handler = type("H", (AdvertisingHandler,), {})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    srv.shutdown()


def test_an_advertised_link_that_refuses_falls_back_to_http_saying_so(advertising_url, caplog):
    url, handler = advertising_url
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        handler.port = s.getsockname()[1]
    with caplog.at_level(logging.INFO, logger="radixlang.backend"):
        b = sgl.RuntimeEndpoint(url)
    assert isinstance(b, HttpBackend) and b.transport == "http"
    assert f"programs go over HTTP: nothing accepts a connection at tcp://127.0.0.1:{handler.port}" in caplog.text
    assert one_gen.run(prompt="x", backend=b)["a"] == " hi"
    with pytest.raises(BackendError, match=f"link='zmq'.*tcp://127.0.0.1:{handler.port}"):
        sgl.RuntimeEndpoint(url, link="zmq")


def test_an_advertised_link_that_never_answers_falls_back_within_its_bound(advertising_url, caplog):
    url, handler = advertising_url
    with socket.socket() as s:  # accepts TCP, never speaks ZeroMQ (some other service on that port)
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        handler.port = s.getsockname()[1]
        with caplog.at_level(logging.INFO, logger="radixlang.backend"):
            b = sgl.RuntimeEndpoint(url)
    assert b.transport == "http" and f"the ZeroMQ link at tcp://127.0.0.1:{handler.port} did not answer" in caplog.text


def test_the_link_is_found_at_the_urls_host_and_http_is_kept_when_asked(advertising_url):
    url, handler = advertising_url
    address, stop = stub_router(silent_after=60.0)
    try:
        handler.port = int(address.rsplit(":", 1)[1])
        b = sgl.RuntimeEndpoint(url.replace("127.0.0.1", "localhost"))
        assert b.transport == "zmq" and b.base_url == f"tcp://localhost:{handler.port}" and b.http_url
        b.shutdown()
        assert sgl.RuntimeEndpoint(url, link="http").transport == "http"
        assert sgl.RuntimeEndpoint(url + "/behind/a/proxy").transport == "http"  # a path: a proxy forwards HTTP only
    finally:
        stop.set()


def test_the_link_argument_is_checked():
    with pytest.raises(ValueError, match="link must be one of auto, zmq, http; got 'udp'"):
        sgl.RuntimeEndpoint("http://127.0.0.1:9", link="udp")
    with pytest.raises(ValueError, match="link='http' needs an http"):
        sgl.RuntimeEndpoint("tcp://127.0.0.1:9", link="http")
