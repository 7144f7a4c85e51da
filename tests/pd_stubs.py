"""FakeBootstrap: a stranger's bootstrap socket speaking the PD protocol (tests/disagg/test_pd_hostile.py).

Stub prefill / decode / worker servers for the PD router's tests (fakes: http.server threads in the
test process). Each records the bodies it got and answers per `mode`:
- "ok": prefill -> first token + input logprobs; decode / worker -> the whole text, no input logprobs
  (streams: 3 SSE events);
- "hold": generate requests wait for `release` (bounded: 30 s) before answering (load on a decode);
- "die": a generate request waits `die_after` s, then the stub drops the connection without an answer
  and stops listening (a killed process: later connections are refused); restart() brings it back;
- "hang": generate and /health block until `release` (bounded: 60 s), like a stopped process;
- "die_mid_stream": a stream sends its first event, then the stub drops the connection and stops listening;
- "die_mid_event": as die_mid_stream, after the first event and half of the second;
- "fail": generate answers 500; "reject": generate answers 400 (the server found the request bad).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

import zmq

from radixlang_runtime.disagg.wire import from_frames, to_frames
from radixlang_runtime.utils.link_key import LinkKey
from radixlang_runtime.protocol.messages import PDDone, PDKVChunk, PDPing, PDPong, PDRegister
from server_utils import free_port


class Stub:
    def __init__(self, role: str, bootstrap_port: Optional[int] = 9100, mode_in_info: Optional[str] = "same"):
        self.role = role
        self.bootstrap_port = bootstrap_port if role == "prefill" else None
        if mode_in_info == "same":
            mode_in_info = None if role == "worker" else role
        self.mode_in_info = mode_in_info
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.mode = "ok"
        self.die_after = 0.3
        self.release = threading.Event()
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        self._server: Optional[ThreadingHTTPServer] = None
        self.start()

    def start(self) -> None:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/health":
                    if stub.mode == "hang":
                        stub.release.wait(60)
                    self._json(200, {"status": "ok"})
                elif self.path == "/server_info":
                    self._json(200, {"disaggregation_mode": stub.mode_in_info,
                                     "disaggregation_bootstrap_port": stub.bootstrap_port})
                elif self.path == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": f"stub-{stub.role}", "object": "model"}]})
                else:
                    self._json(404, {"error": {"message": "no such route"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/flush_cache":
                    self._json(200, {"flushed": True})
                    return
                with stub.lock:
                    stub.bodies.append({"path": self.path, **body})
                mode = stub.mode
                if mode == "die":
                    time.sleep(stub.die_after)
                    stub.kill()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if mode in ("hold", "hang"):
                    stub.release.wait(30 if mode == "hold" else 60)
                if mode == "reject":
                    self._json(400, {"error": {"message": "stub refuses max_new_tokens", "param": "max_new_tokens",
                                               "type": "invalid_request_error", "code": 400}})
                    return
                if mode == "fail":
                    self._json(500, {"error": {"message": "stub failure", "type": "server_error", "param": None,
                                               "code": 500}})
                    return
                answer = stub.answer(body)
                if body.get("stream"):  # chunked, as uvicorn sends it: a cut stream is visible as one
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for i, event in enumerate(answer):
                        data = b"data: " + json.dumps(event).encode() + b"\n\n"
                        if mode == "die_mid_event" and i == 1:  # killed while writing an event
                            self._chunk(data[:len(data) // 2])
                            stub.kill()
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                        self._chunk(data)
                        if mode == "die_mid_stream":  # one event out, then the process is gone
                            stub.kill()
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                        time.sleep(0.02)
                    self._chunk(b"data: [DONE]\n\n")
                    self._chunk(b"")
                else:
                    self._json(200, answer[-1])

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _json(self, status: int, obj: Any) -> None:
                raw = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def answer(self, body: dict) -> list[dict]:
        """The events of an answer (the last one is the whole answer)."""
        rid = f"{self.role}-{body.get('bootstrap_room')}"
        if self.role == "prefill":
            meta = {"id": rid, "input_token_logprobs": [[None, 1, None], [-0.5, 2, None]]}
            return [{"text": "A", "meta_info": meta}]
        return [{"text": "A" * k, "meta_info": {"id": rid, "completion_tokens": k, "input_token_logprobs": None}}
                for k in (1, 2, 3)]

    def kill(self) -> None:
        """Stop listening (later connections are refused); requests in progress end as they may."""
        if self._server is not None:
            server, self._server = self._server, None
            threading.Thread(target=lambda: (server.shutdown(), server.server_close()), daemon=True).start()
            deadline = time.time() + 10
            while time.time() < deadline and self._listening():
                time.sleep(0.02)

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def restart(self) -> None:
        self.kill()
        self.mode = "ok"
        self.release = threading.Event()
        self.start()

    def generate_bodies(self) -> list[dict]:
        with self.lock:
            return list(self.bodies)


class FakeBootstrap:
    """A fake prefill's bootstrap socket (a ZeroMQ ROUTER on a thread): it answers pings and every PDRegister
    with K/V of its own (`fill` bytes) for the registered positions and PDDone(first_token). key: the secret
    it tags its messages with (None: none; a decode with a secret drops them all)."""

    def __init__(self, first_token: int = 1, fill: int = 0x7F, key: Optional[str] = None):
        self.port = free_port()
        self.first_token, self.fill = first_token, fill
        self.key = LinkKey(key) if key else None
        self.registered: list[PDRegister] = []
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(f"tcp://127.0.0.1:{self.port}")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _send(self, ident: bytes, msg: Any) -> None:
        self._sock.send_multipart([ident, *to_frames(msg, self.key)])

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(50):
                continue
            ident, *frames = self._sock.recv_multipart()
            try:
                msg = from_frames(frames[1:] if self.key is None and len(frames) > 1 else frames, self.key)
            except ValueError:
                continue  # tagged by a decode with a secret this stub does not hold: read the header anyway
            if isinstance(msg, PDPing):
                self._send(ident, PDPong(msg.seq))
            elif isinstance(msg, PDRegister):
                self.registered.append(msg)
                n = msg.total_len - msg.prefix_len
                self._send(ident, PDKVChunk(msg.room, msg.prefix_len, bytes([self.fill]) * (n * msg.token_bytes)))
                self._send(ident, PDDone(msg.room, self.first_token, 0))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close(0)
        self._ctx.term()
