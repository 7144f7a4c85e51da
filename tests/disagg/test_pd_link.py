"""The PD transport over real ZeroMQ sockets on localhost: messages both ways, heartbeats answered by the link
thread (no scheduler involved), a closed prefill shows as a silent peer, a restarted one is heard again."""

from __future__ import annotations

import time

import pytest

from radixlang_runtime.disagg.link import BootstrapClient, BootstrapServer, from_frames, to_frames
from radixlang_runtime.protocol.messages import PDAck, PDKVChunk, PDRegister, encode
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
        assert p == peer and isinstance(chunk.payload, memoryview)  # ZeroMQ's buffer, not a copy
        assert (chunk.room, chunk.start, bytes(chunk.payload)) == (5, 0, b"\x01" * 24)
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


def test_receive_takes_a_byte_budget_of_chunks_in_order():
    client = BootstrapClient(heartbeat_timeout=0.5)  # not started: messages noted by hand, no sockets
    peer = ("127.0.0.1", 1)
    msgs = [PDKVChunk(1, 0, b"\x00" * 600), PDRegister(2, 0, 3, 8), PDKVChunk(1, 10, b"\x00" * 600),
            PDKVChunk(1, 20, b"\x00" * 600)]
    for m in msgs:
        client._note(peer, to_frames(m))
    assert client.in_bytes == 1800
    assert [m for _, m in client.receive(max_bytes=1000)] == msgs[:2]  # the next chunk would pass 1,000 bytes
    assert client.in_bytes == 1200
    assert [m for _, m in client.receive(max_bytes=100)] == msgs[2:3]  # at least one message
    assert [m for _, m in client.receive()] == msgs[3:] and client.in_bytes == 0
    assert client.receive(max_bytes=100) == []


def test_a_throttled_client_leaves_kv_in_the_socket_and_keeps_the_peer_alive():
    port = free_port()
    server = BootstrapServer("127.0.0.1", port, heartbeat_timeout=0.5)
    client = BootstrapClient(heartbeat_timeout=0.5, max_buffered=2 << 20)
    server.start()
    client.start()
    peer = ("127.0.0.1", port)
    mib = 1 << 20
    try:
        client.send(peer, PDRegister(room=5, prefix_len=0, total_len=3, token_bytes=8))
        [(decode_id, _)] = _wait(server.receive)
        for i in range(40):  # 40 MiB, far past what the client buffers
            server.send(decode_id, PDKVChunk(5, i, bytes([i]) * mib))
        _wait(lambda: client.in_bytes >= 2 * mib)
        time.sleep(1.0)  # throttled for two heartbeat timeouts: the queued chunks wait in the socket
        assert 2 * mib <= client.in_bytes <= 3 * mib
        assert client.silent_for(peer) < 0.5  # readable, not read: alive
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 40:
            assert time.monotonic() < deadline, len(got)
            batch = client.receive(max_bytes=mib)
            assert len(batch) <= 1
            got += [m for _, m in batch]
            time.sleep(0.005)
        assert [c.start for c in got] == list(range(40))
        assert all(c.payload == bytes([c.start]) * mib for c in got)
        assert server.dropped == 0
    finally:
        client.close()
        server.close()


def test_frames_a_chunk_in_two_and_refuses_other_splits():
    chunk = PDKVChunk(3, 7, b"\x02" * 10)
    head, body = to_frames(chunk)
    assert body == chunk.payload and from_frames([head, body]) == chunk
    assert from_frames([encode(chunk)]) == chunk  # one frame: the payload inside msgpack, as encode() writes it
    assert to_frames(PDAck(3)) == [encode(PDAck(3))]
    with pytest.raises(ValueError, match="PDAck in 2 frames"):
        from_frames([encode(PDAck(3)), b"x"])
    with pytest.raises(ValueError, match="a message of 3 frames"):  # counted before anything is decoded
        from_frames([head, body, body])
    with pytest.raises(ValueError, match="PDKVChunk in 2 frames"):
        from_frames([encode(chunk), body])  # a payload in both places
