"""PD against strangers, without servers: the roles (two torch-free Schedulers joined by test_pd_roles' in-memory
link) keyed by (peer, room), duplicate rooms refused with 400 on both roles, a forged first token failing its
request only, dead peers' sockets closed; the real link (ZeroMQ on localhost) with a shared secret, an address
it cannot connect to, 80 peers' sockets given back (fd count), its thread restarted or named; the bootstrap
fields, the allow-list and the secret flags checked before anything connects. Both allocators whole after
every scenario (check_integrity)."""

from __future__ import annotations

import os
import time

import pytest

from fakes import VOCAB, expected_output
from radixlang_runtime.protocol.bootstrap_peers import Bootstrap, parse_peers
from radixlang_runtime.disagg.link import BootstrapClient, BootstrapServer
from radixlang_runtime.utils.faults import FatalFault
from radixlang_runtime.protocol.generate_input import parse_bootstrap
from radixlang_runtime.protocol.limits import FieldError
from radixlang_runtime.utils.link_key import LinkKey
from radixlang_runtime.protocol.messages import PDAck, PDDone, PDKVChunk, PDRegister
from radixlang_runtime.utils.rate_limit import PeerRateLimit
from radixlang_runtime.server_args import REDACTED, ServerArgs
from server_utils import free_port
from test_pd_roles import HOST, pair, pd_req, run, twin
from scheduler_utils import assert_whole


def _wait(pred, bound=10.0):
    deadline = time.monotonic() + bound
    while not (got := pred()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
    return got


# ---------------------------------------------------------------------- the roles
def test_a_duplicate_room_is_refused_400_on_both_roles_and_the_first_is_served():
    pre, dec, _ = pair()
    first, second = pd_req("first", 20, 4, room=5), pd_req("second", 12, 4, room=5, seed=1)
    for r in (first, second):
        pre.add_request(r)
        dec.add_request(twin(r))
    done = run(pre, dec)
    for side, server in (("p", "prefill"), ("d", "decode")):
        dup = done[(side, "second")]
        assert dup.error_status == 400 and "bootstrap_room 5 is already in flight" in dup.error, server
    assert done[("p", "first")].error is None
    assert done[("d", "first")].output_ids == expected_output(first.input_ids, 4)
    assert dec.pd.stats()["receiving"] == 0 and pre.pd.stats()["held"] == 0
    assert_whole(pre)
    assert_whole(dec)
    again = pd_req("again", 12, 3, room=5, seed=2)  # the room is free again once its request ended
    pre.add_request(again)
    dec.add_request(twin(again))
    assert run(pre, dec)[("d", "again")].output_ids == expected_output(again.input_ids, 3)


def test_messages_from_a_peer_the_room_did_not_name_are_dropped_and_counted():
    pre, dec, _ = pair()
    r = pd_req("r", 20, 4, room=8)
    pre.add_request(r)
    dec.add_request(twin(r))
    dec.step()  # registered with HOST
    stranger = ("10.9.9.9", 9999)
    dec.pd.link.inbox += [(stranger, PDKVChunk(8, 0, b"\x00" * 24 * 20)), (stranger, PDDone(8, 1, 0))]
    dec.step()
    assert dec.pd.stats()["dropped_by_reason"] == {"unmatched": 2}
    done = run(pre, dec)
    assert done[("d", "r")].output_ids == expected_output(r.input_ids, 4)  # only the prefill's K/V landed
    assert_whole(pre)
    assert_whole(dec)


def test_a_forged_first_token_fails_its_request_only():
    pre, dec, _ = pair()
    dec.pd.vocab_size = VOCAB
    forged, fine = pd_req("forged", 20, 4, room=1), pd_req("fine", 16, 4, room=2, seed=3)
    for r in (forged, fine):
        pre.add_request(r)
        dec.add_request(twin(r))
    real = dec.pd.link.receive

    def receive(max_bytes=None):
        return [(p, PDDone(1, 10**9, 0) if isinstance(m, PDDone) and m.room == 1 else m) for p, m in real(max_bytes)]

    dec.pd.link.receive = receive
    done = run(pre, dec)
    bad = done[("d", "forged")]
    assert bad.error_status == 503 and "first token 1000000000 is outside the vocabulary" in bad.error
    assert done[("d", "fine")].output_ids == expected_output(fine.input_ids, 4)
    assert "outside the vocabulary" in done[("p", "forged")].error  # told (PDCancel), the prefill ended it too
    assert_whole(pre)
    assert_whole(dec)


def test_a_dead_peers_socket_is_closed_once_no_request_uses_it():
    pre, dec, clock = pair()
    forgotten = []
    dec.pd.link.forget = forgotten.append
    dead = ("127.0.0.1", 1)
    r = pd_req("r", 10, 2, room=3)
    r.bootstrap = Bootstrap(*dead, 3)
    dec.add_request(r)
    dec.step()  # registered with the dead peer
    dec.pd.link.silent[dead] = 2.0
    clock.t = 2.0
    ended = [q for q in dec.step() if q.finished]
    assert ended and "127.0.0.1:1 is unreachable" in ended[0].error
    assert forgotten == [dead] and dec.pd.stats()["peer_sockets"] == 0
    live = pd_req("live", 10, 2, room=4)  # HOST stays open while a request uses it
    pre.add_request(live)
    dec.add_request(twin(live))
    run(pre, dec)
    assert HOST not in forgotten and dec.pd.stats()["peer_sockets"] == 1  # idle, alive: kept PEER_IDLE_S
    assert_whole(dec)


def test_a_link_that_stays_down_raises_fatal_fault_in_the_role():
    pre, dec, _ = pair()
    dec.pd.link.problem = "the PD link thread failed 6 times within 60 s (last: RuntimeError())"
    with pytest.raises(FatalFault, match="PD link thread failed"):
        dec.pd.poll(0)


# ---------------------------------------------------------------------- the link
def _pair_link(server_key, client_key, hb=0.5):
    port = free_port()
    server = BootstrapServer("127.0.0.1", port, heartbeat_timeout=hb, key=server_key)
    client = BootstrapClient(heartbeat_timeout=hb, key=client_key)
    server.start()
    client.start()
    return server, client, ("127.0.0.1", port)


def test_the_secret_admits_its_holders_only():
    key = LinkKey("s3cret")
    for client_key, reason in ((LinkKey("wrong"), "secret"), (None, "frames")):
        server, client, peer = _pair_link(key, client_key)
        try:
            client.send(peer, PDRegister(room=5, prefix_len=0, total_len=3, token_bytes=8))
            _wait(lambda: server.dropped_in[reason] >= 2)  # the registration and the pings
            assert server.receive() == []
            time.sleep(0.7)  # the prefill's pongs never come: silent
            assert client.silent_for(peer) > 0.5
        finally:
            client.close()
            server.close()
    server, client, peer = _pair_link(key, LinkKey("s3cret"))
    try:
        client.send(peer, PDRegister(room=5, prefix_len=0, total_len=3, token_bytes=8))
        [(decode_id, reg)] = _wait(server.receive)
        assert reg == PDRegister(5, 0, 3, 8)
        server.send(decode_id, PDKVChunk(5, 0, b"\x01" * 24))
        [(_, chunk)] = _wait(client.receive)
        assert bytes(chunk.payload) == b"\x01" * 24
        assert sum(server.dropped_in.values()) == sum(client.dropped_in.values()) == 0
        assert client.silent_for(peer) < 0.5
    finally:
        client.close()
        server.close()


def test_an_address_zeromq_refuses_costs_its_message_not_the_thread():
    server, client, peer = _pair_link(None, None)
    try:
        client.send(("*", 1234), PDAck(1))  # the intake refuses it (400); the link survives it anyway
        _wait(lambda: client.dropped == 1)
        client.send(peer, PDRegister(room=9, prefix_len=0, total_len=3, token_bytes=8))
        [(_, reg)] = _wait(server.receive)
        assert reg.room == 9 and client.problem is None and client.restarts == 0
    finally:
        client.close()
        server.close()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_eighty_peers_sockets_are_given_back():
    client = BootstrapClient(heartbeat_timeout=0.5)
    client.start()
    try:
        warm = ("127.0.0.1", free_port())  # the context's own I/O thread and fds come with its first socket
        client.send(warm, PDAck(0))
        client.forget(warm)
        _wait(lambda: not client.socks)
        time.sleep(0.5)
        before = _fds()
        ports: set[int] = set()
        while len(ports) < 80:  # distinct: free_port may hand out a port it gave before
            ports.add(free_port())
        peers = [("127.0.0.1", p) for p in sorted(ports)]  # nothing listens there
        for p in peers:
            client.send(p, PDRegister(1, 0, 3, 8))
        _wait(lambda: len(client.socks) == 80)
        assert _fds() > before
        for p in peers:
            client.forget(p)
        # <=: an fd another test's object frees meanwhile (its garbage collected) moves the count too
        _wait(lambda: not client.socks and _fds() <= before, bound=20)
        assert _fds() <= before
    finally:
        client.close()


def test_a_failing_link_loop_restarts_and_one_that_keeps_failing_is_named():
    server, client, peer = _pair_link(None, None)
    real = client._poll_in
    fails = {"left": 1}

    def flaky():
        if fails["left"]:
            fails["left"] -= 1
            raise RuntimeError("poll broke")
        real()

    try:
        client._poll_in = flaky
        _wait(lambda: client.restarts == 1)
        client.send(peer, PDRegister(room=2, prefix_len=0, total_len=3, token_bytes=8))
        _wait(server.receive)  # restarted: it still serves
        assert client.problem is None
        fails["left"] = 10**9
        _wait(lambda: client.problem is not None)
        assert "PD link thread failed 6 times" in client.problem and "poll broke" in client.problem
    finally:
        client.close()
        server.close()


# ---------------------------------------------------------------------- the intake and the flags
@pytest.mark.parametrize("host", ["*", "0.0.0.0", "::", "eth0;10.0.0.1", "a b", "h:1", "", "-x", "224.0.0.1",
                                  "[::1]", "1.2.3"])
def test_a_bootstrap_host_that_names_no_single_machine_is_refused(host):
    body = {"bootstrap_host": host, "bootstrap_port": 8998, "bootstrap_room": 1}
    with pytest.raises(FieldError) as e:
        parse_bootstrap(body, "decode")
    assert e.value.param == "bootstrap_host"


def test_bootstrap_fields_accepted_and_the_allow_list():
    for host in ("127.0.0.1", "prefill-0.svc.local", "::1", "LocalHost"):
        got = parse_bootstrap({"bootstrap_host": host, "bootstrap_port": 8998, "bootstrap_room": 2**63 - 1}, "decode")
        assert got.host == host.lower() and got.room == 2**63 - 1
    peers = parse_peers("127.0.0.1:8998, [::1]:9000")
    assert peers == (("127.0.0.1", 8998), ("::1", 9000))
    assert parse_bootstrap({"bootstrap_host": "::1", "bootstrap_port": 9000, "bootstrap_room": 1}, "decode", peers)
    with pytest.raises(FieldError, match="127.0.0.1:9000 is not a prefill") as e:
        parse_bootstrap({"bootstrap_host": "127.0.0.1", "bootstrap_port": 9000, "bootstrap_room": 1}, "decode",
                        [list(p) for p in peers])  # as the limits arrive over IPC
    assert e.value.param == "bootstrap_host"
    for field, value in (("bootstrap_port", 0), ("bootstrap_port", 70000), ("bootstrap_room", -1),
                         ("bootstrap_room", 2**63), ("bootstrap_room", "1")):
        body = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": 1, field: value}
        with pytest.raises(FieldError) as e:
            parse_bootstrap(body, "prefill")
        assert e.value.param == field


def test_peer_and_secret_flags(tmp_path):
    for spec in ("a", "a:0", "*:1", "a:1,", "0.0.0.0:1"):
        with pytest.raises(ValueError, match="disaggregation_prefill_peers"):
            parse_peers(spec)
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\n")
    args = ServerArgs(disaggregation_mode="decode", disaggregation_secret_file=str(secret),
                      disaggregation_prefill_peers="10.0.0.1:8998")
    assert args.disaggregation_secret == "from-a-file" and args.disaggregation_secret_file is None
    assert args.to_public_dict()["disaggregation_secret"] == REDACTED
    with pytest.raises(ValueError, match="not both"):
        ServerArgs(disaggregation_mode="decode", disaggregation_secret="x", disaggregation_secret_file=str(secret))
    with pytest.raises(ValueError, match="decode only"):
        ServerArgs(disaggregation_mode="prefill", disaggregation_prefill_peers="10.0.0.1:8998")
    with pytest.raises(ValueError, match="prefill or decode only"):
        ServerArgs(disaggregation_secret="x")


def test_peer_rate_limit():
    t = [0.0]
    lim = PeerRateLimit(rate=10, burst=20, total_rate=15, max_peers=2, clock=lambda: t[0])
    assert sum(lim.allow("a") for _ in range(25)) == 20  # a sender's burst
    assert sum(lim.allow("b") for _ in range(25)) == 10  # what is left of the shared bucket (2 x 15)
    t[0] = 1.0
    assert sum(lim.allow("a") for _ in range(25)) == 10  # a sender's rate
    assert lim.allow("c")
    assert list(lim._peers) == ["a", "c"]  # b, the least recently heard, left (max_peers 2)


def test_pd_dropped_messages_on_metrics():
    from prometheus_client.parser import text_string_to_metric_families

    from radixlang_runtime.server.metrics import ServerMetrics
    from server_utils import STATS

    stats = {**STATS, "disaggregation": {"dropped_by_reason": {"secret": 3, "unmatched": 2}}}
    text = ServerMetrics("m").render(stats).decode()
    got = {(s.name, s.labels.get("reason")): s.value for fam in text_string_to_metric_families(text)
           for s in fam.samples if s.name == "radixlang:pd_dropped_messages"}
    assert got == {("radixlang:pd_dropped_messages", "secret"): 3, ("radixlang:pd_dropped_messages", "unmatched"): 2}
