"""The PD transport over real ZeroMQ sockets on localhost: messages both ways, heartbeats answered by the link
thread (no scheduler involved), a closed prefill shows as a silent peer, a restarted one is heard again."""

from __future__ import annotations

import time

from radixlang_runtime.disagg.link import BootstrapClient, BootstrapServer
from radixlang_runtime.messages import PDKVChunk, PDRegister
from server_utils import free_port


def _wait(pred, bound=10.0):
    deadline = time.monotonic() + bound
    while not (got := pred()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
    return got


def test_messages_both_ways_heartbeats_and_a_dead_prefill():
    port = free_port()
    server = BootstrapServer("127.0.0.1", port, heartbeat_timeout=0.5)
    client = BootstrapClient(heartbeat_timeout=0.5)
    server.start()
    client.start()
    peer = ("127.0.0.1", port)
    try:
        client.send(peer, PDRegister(room=5, prefix_len=0, total_len=3, token_bytes=8))
        [(decode_id, reg)] = _wait(server.receive)
        assert reg == PDRegister(5, 0, 3, 8)
        server.send(decode_id, PDKVChunk(5, 0, b"\x01" * 24))
        [(p, chunk)] = _wait(client.receive)
        assert p == peer and chunk.payload == b"\x01" * 24
        time.sleep(1.0)  # pings every 0.1 s keep both sides fresh; pongs never reach the roles
        assert client.silent_for(peer) < 0.5 and server.silent_for(decode_id) < 0.5
        assert client.receive() == [] and server.receive() == []
        server.close()
        _wait(lambda: client.silent_for(peer) > 0.5)
        server = BootstrapServer("127.0.0.1", port, heartbeat_timeout=0.5)  # a restart on the same port
        server.start()
        _wait(lambda: client.silent_for(peer) < 0.2)
    finally:
        client.close()
        server.close()
