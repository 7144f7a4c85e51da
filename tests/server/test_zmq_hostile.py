"""Strangers on the DSL's ZeroMQ link (--frontend-port, server/frontend_zmq.py). Against one real
server: 1,000 hostile messages from raw DEALER sockets (random bytes, truncated and misshapen
msgpack, wrong frame counts, with and without the key), oversized frames and raw TCP garbage; each
malformed message is counted as dropped (exactly, by reason), answered only when its sender holds
the key, and afterwards a DSL program over the link (the client that was there, and a new one,
streaming) gives the greedy text it gave before, /health is 200 and no loop died. Without a model: the
supervisor restarts a failing loop and /health names a frontend that stays down; a dispatch that
raises is answered 500, a req_id already in flight 400, and the next message is served; a client
names an address where nothing answers, within seconds."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
import types
from collections import Counter
from dataclasses import dataclass
from typing import Optional

import httpx
import msgpack
import pytest
import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

import radixlang as sgl
from radixlang.errors import BackendError
from radixlang_runtime.protocol import messages as m
from radixlang_runtime.server.frontend_zmq import MAX_FRAME_BYTES, OPEN_MSG_BYTES, FrontendServer
from server_utils import KEYED_FLAGS, KEYED_KEY, ServerProcess, free_port, shared_server

KEY = KEYED_KEY
AUTH = {"Authorization": f"Bearer {KEY}"}
N_HOSTILE, N_DEALERS = 1000, 16


@pytest.fixture(scope="module")
def server():
    """The session's keyed server (test_fuzz_intake's too): every check here is on deltas or on the server
    still serving, never on counters since its start."""
    return shared_server(*KEYED_FLAGS, frontend=True)


@sgl.function
def capital(s):
    s += "The capital of France is" + sgl.gen("a", max_tokens=8, temperature=0)


# ---------------------------------------------------------------------- the hostile messages
@dataclass
class Hostile:
    frames: list[bytes]  # what the DEALER sends (the ROUTER prepends the sender's ident)
    dropped: Optional[str]  # the reason frontend_zmq counts it under; None: it is served
    rid: Optional[str] = None  # the req_id its answer carries
    status: Optional[int] = None  # that answer's status; None: no answer at all


def req(rid, method, body=None, key=KEY) -> bytes:
    return m.encode(m.FrontendReq(rid, method, body, key))


def undecoded(data: bytes) -> str:
    """The reason a message that is no FrontendReq is dropped: too large to read without the key, or not one."""
    return "size" if len(data) > OPEN_MSG_BYTES else "decode"


BIG = "x" * (1 << 20)
NOT_A_REQUEST = [  # valid msgpack, or headers of it, that decode() cannot make a FrontendReq of
    msgpack.packb(5), msgpack.packb("FrontendReq"), msgpack.packb([]), msgpack.packb(["FrontendReq"]),
    msgpack.packb(["FrontendReq", 5]), msgpack.packb(["FrontendReq", []]), msgpack.packb([["x"], []]),
    msgpack.packb(["FrontendReq", ["r", "ping", None, None, "extra"]]),
    msgpack.packb(["FrontendReq", [1, 2, 3, 4, 5, KEY]]),  # ends with the key, still nothing
    msgpack.packb(msgpack.ExtType(5, b"x")), b"\x91" * 3000 + b"\xc0",  # nesting beyond msgpack's stack
    b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff"]  # headers claiming 4 G

VARIANTS = [  # rid -> a message and what becomes of it
    *[lambda rid, d=d: Hostile([d], "decode") for d in NOT_A_REQUEST],
    lambda rid: Hostile([msgpack.packb(["AbortReq", [rid]])], "type"),
    # FrontendReq with fields of the wrong types: answered 400 only to a key holder with a string req_id
    lambda rid: Hostile([req(rid, 7)], "shape", rid, 400),
    lambda rid: Hostile([req(rid, {"a": 1}, BIG)], "shape", rid, 400),
    lambda rid: Hostile([req([1], "generate")], "shape"),
    lambda rid: Hostile([req(rid, "ping", key=12345)], "shape"),
    lambda rid: Hostile([req(rid, "abort", [1, 2])], "shape", rid, 400),
    lambda rid: Hostile([req(rid, "abort", [1, 2], key=None)], "shape"),
    lambda rid: Hostile([req(rid, "abort", {"req_id": 5})], "shape", rid, 400),
    # large without the key: dropped unread, where a small one is refused 401
    lambda rid: Hostile([req(rid, "model_info", BIG, key="wrong")], "size"),
    lambda rid: Hostile([req(rid, "model_info", None, key="wrong")], None, rid, 401),
    # well formed: served (answers the tests can predict), never counted
    lambda rid: Hostile([req(rid, "ping", key=None)], None, rid, 200),
    lambda rid: Hostile([req(rid, "generate", {"text": "hi"}, key=None)], None, rid, 401),
    lambda rid: Hostile([req(rid, "generate", [1, 2])], None, rid, 400),
    lambda rid: Hostile([req(rid, "generate", {"text": 5})], None, rid, 400),
    lambda rid: Hostile([req(rid, "no such method")], None, rid, 404),
    lambda rid: Hostile([req(rid, "model_info", BIG)], None, rid, 200),  # large, with the key: read
    lambda rid: Hostile([req(rid, "abort", {"req_id": "nothing-to-abort"})], None),
]


def hostile_messages(rng: random.Random) -> list[Hostile]:
    out: list[Hostile] = []
    while len(out) < N_HOSTILE:
        i, rid = len(out), f"h{len(out)}"
        kind = i % 10
        if kind < 4:  # random bytes of random sizes
            size = rng.choice([0, 1, rng.randint(2, 64), rng.randint(65, 4096), rng.randint(4097, 200_000)])
            data = rng.randbytes(size)
            out.append(Hostile([data], undecoded(data)))
        elif kind < 6:  # a real request cut short, with or without the key
            body = {"text": "Hello " * rng.randint(1, 2000), "sampling_params": {"max_new_tokens": 4}}
            full = req(rid, "generate", body, key=rng.choice([KEY, None]))
            data = full[:rng.randrange(len(full))]
            out.append(Hostile([data], undecoded(data)))
        elif kind == 6:  # valid requests in a message of 2-4 frames (or empty frames)
            n = rng.randint(2, 4)
            out.append(Hostile([req(rid, "ping")] * n if rng.random() < 0.8 else [b""] * n, "frames"))
        else:  # every variant, in turn
            out.append(VARIANTS[(i // 10 * 3 + kind - 7) % len(VARIANTS)](rid))
    return out


def dealer(ctx: zmq.Context, address: str) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    return s


def send_and_drain(address: str, msgs: list[Hostile], timeout: float = 60.0) -> dict[str, int]:
    """Send `msgs` over N_DEALERS sockets, then a sync ping on each; read every answer until all the
    expected ones and every sync pong came (replies to one socket keep its order). -> {req_id: status}."""
    ctx = zmq.Context()
    socks = [dealer(ctx, address) for _ in range(N_DEALERS)]
    try:
        for i, h in enumerate(msgs):
            socks[i % N_DEALERS].send_multipart(h.frames)
        for j, s in enumerate(socks):
            s.send(req(f"sync-{j}", "ping", key=None))
        want = {h.rid for h in msgs if h.status is not None} | {f"sync-{j}" for j in range(N_DEALERS)}
        got: dict[str, int] = {}
        poller = zmq.Poller()
        for s in socks:
            poller.register(s, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        while not want <= set(got) and time.monotonic() < deadline:
            for s, _ in poller.poll(200):
                while s.poll(0):
                    out = m.decode(s.recv())
                    assert out.req_id not in got, f"two answers to {out.req_id}"
                    got[out.req_id] = out.status
        assert want <= set(got), f"no answer to {sorted(want - set(got))[:10]} within {timeout:.0f} s"
        return got
    finally:
        for s in socks:
            s.close(0)
        ctx.term()


def frontend_info(srv: ServerProcess) -> dict:
    r = httpx.get(srv.url + "/server_info", headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["frontend"]


def dropped_metric(srv: ServerProcess) -> float:
    text = httpx.get(srv.url + "/metrics", headers=AUTH, timeout=30).text
    lines = [ln for ln in text.splitlines() if ln.startswith("radixlang:frontend_dropped_messages_total ")]
    assert len(lines) == 1, "radixlang:frontend_dropped_messages_total not in /metrics"
    return float(lines[0].split()[1])


def oversized_frame_disconnects(address: str, timeout: float = 30.0) -> None:
    """A frame over MAX_FRAME_BYTES: libzmq drops its sender (the client's monitor sees it go)."""
    ctx = zmq.Context()
    s = dealer(ctx, address)
    mon = s.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    try:
        s.send(b"\0" * (MAX_FRAME_BYTES + 1), copy=False)
        deadline, events = time.monotonic() + timeout, []
        while zmq.EVENT_DISCONNECTED not in events and time.monotonic() < deadline:
            if mon.poll(200):
                events.append(recv_monitor_message(mon)["event"])
        assert zmq.EVENT_DISCONNECTED in events, f"the sender of {MAX_FRAME_BYTES + 1} bytes kept its connection"
    finally:
        s.disable_monitor()
        mon.close(0)
        s.close(0)
        ctx.term()


def raw_tcp_garbage(port: int, rng: random.Random, n: int = 10) -> None:
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            try:
                c.sendall(rng.randbytes(4096))
            except OSError:
                pass  # the server may hang up on it first


def test_hostile_traffic_leaves_the_link_serving(server):
    zmq_old = sgl.RuntimeEndpoint(server.frontend, api_key=KEY)  # a client there before, and after
    before_text = capital.run(backend=zmq_old)["a"]
    info0 = frontend_info(server)
    rng = random.Random(27)
    msgs = hostile_messages(rng)

    t0 = time.monotonic()
    got = send_and_drain(server.frontend, msgs)
    print(f"{len(msgs)} hostile messages sent and drained in {time.monotonic() - t0:.2f} s")
    want = {h.rid: h.status for h in msgs if h.status is not None}
    assert {k: v for k, v in got.items() if not k.startswith("sync-")} == want  # none else was answered

    info = frontend_info(server)
    grew = Counter(info["dropped_by_reason"])
    grew.subtract(info0["dropped_by_reason"])
    assert +grew == Counter(h.dropped for h in msgs if h.dropped is not None)
    assert info["dropped_messages"] - info0["dropped_messages"] == sum(h.dropped is not None for h in msgs)
    assert dropped_metric(server) == info["dropped_messages"]

    oversized_frame_disconnects(server.frontend)
    raw_tcp_garbage(int(server.frontend.rsplit(":", 1)[1]), rng)

    zmq_new = sgl.RuntimeEndpoint(server.frontend, api_key=KEY)
    after_old = capital.run(backend=zmq_old)["a"]
    streamed = capital.run(backend=zmq_new, stream=True)
    assert before_text and after_old == before_text and streamed["a"] == before_text
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    info = frontend_info(server)
    assert info["loop_restarts"] == 0 and info["problem"] is None
    zmq_old.shutdown()
    zmq_new.shutdown()


def test_server_info_over_zmq_shows_no_key(server):
    b = sgl.RuntimeEndpoint(server.frontend, api_key=KEY)
    try:
        over_zmq = json.dumps(b.get_server_info())
    finally:
        b.shutdown()
    over_http = httpx.get(server.url + "/server_info", headers=AUTH, timeout=30).text
    assert '"api_key"' in over_zmq and "sekrit" not in over_zmq
    assert "sekrit" not in over_http


# ---------------------------------------------------------------------- no model
def test_a_failing_loop_is_restarted_and_one_that_stays_down_turns_health_503():
    from fastapi.testclient import TestClient

    from radixlang_runtime.server.http_common import ServerState
    from radixlang_runtime.server.http_server import create_app
    from radixlang_runtime.server_args import ServerArgs

    address = f"tcp://127.0.0.1:{free_port()}"
    calls = Counter()

    async def flaky_janitor():
        calls["janitor"] += 1
        if calls["janitor"] == 1:
            raise RuntimeError("the janitor broke once")
        await asyncio.sleep(3600)

    async def broken_send():
        calls["send"] += 1
        raise RuntimeError("the send loop is broken")

    async def until(cond, what: str) -> None:
        deadline = time.monotonic() + 10
        while not cond():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.01)

    async def main() -> FrontendServer:
        fs = FrontendServer(address, types.SimpleNamespace(routes=[]), types.SimpleNamespace(metrics=None), None)
        fs._janitor = flaky_janitor
        try:
            fs.start()
            await until(lambda: calls["janitor"] == 2, "the janitor was not restarted")
            assert fs.stats()["loop_restarts"] == 1 and fs.problem() is None
            fs._send_loop = broken_send
            fs._loops["send"].cancel()  # a cancelled loop is not restarted; the broken one is
            await asyncio.sleep(0)
            fs._spawn("send")
            await until(lambda: fs.problem() is not None, "a loop that keeps failing did not become a problem")
            assert calls["send"] == 6 and not fs._loops["recv"].done()
        finally:
            await fs.close()
        return fs

    fs = asyncio.run(main())
    assert address in fs.problem() and "send loop" in fs.problem()
    async def healthy():  # TokenizerManager.health: None = healthy (the frontend's verdict is added after it)
        return None

    state = ServerState(ServerArgs(), types.SimpleNamespace(dead=None, metrics=None, health=healthy), "/m", "m", {})
    client = TestClient(create_app(state))
    assert client.get("/health").status_code == 200
    state.frontend = fs
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["error"]["message"] == fs.problem()


def test_a_raising_dispatch_is_answered_500_a_duplicate_400_and_the_next_message_served():
    address = f"tcp://127.0.0.1:{free_port()}"

    async def main() -> dict:
        async def forever(*args, **kwargs):  # a request in flight until the end
            await asyncio.Event().wait()

        tm = types.SimpleNamespace(metrics=None, pin_prefix=forever, run_intake=forever)
        fs = FrontendServer(address, types.SimpleNamespace(routes=[]), tm, KEY)
        real = fs._dispatch

        def dispatch(ident, r, authorized):
            if r.method == "boom":
                raise KeyError("boom")
            real(ident, r, authorized)

        fs._dispatch = dispatch
        fs.start()
        ctx = zmq.asyncio.Context()
        s = ctx.socket(zmq.DEALER)
        s.connect(address)
        try:
            got = {}
            for data in (req("1", "boom"), req("2", "boom", key=None), req("d", "pin_prefix", {"input_ids": [1]}),
                         req("d", "pin_prefix", {"input_ids": [2]}), req("3", "ping", key=None), req("4", "nope")):
                await s.send(data)
            while not {"3", "4"} <= set(got):  # a ping is answered on the socket thread, "4" after the others
                out = m.decode(await asyncio.wait_for(s.recv(), 10))
                got[out.req_id] = (out.status, out.body)
            return {"got": got, "stats": fs.stats()}
        finally:
            s.close(0)
            ctx.term()
            await fs.close()

    res = asyncio.run(main())
    got, stats = res["got"], res["stats"]
    assert got["1"][0] == 500 and "boom" in got["1"][1]["error"]["message"]
    assert got["d"][0] == 400 and "already in flight" in got["d"][1]["error"]["message"]
    assert set(got) == {"1", "d", "3", "4"} and got["3"] == (200, "pong")  # the stranger's "2" is not answered
    assert got["4"][0] == 404
    assert stats["dropped_by_reason"] == {"dispatch": 2, "duplicate": 1} and stats["loop_restarts"] == 0


def test_the_client_names_an_address_where_nothing_answers():
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(BackendError) as err:
        sgl.RuntimeEndpoint(address)
    assert f"no radixlang server answers at {address} " in str(err.value)  # the probe's bound, named
