"""PD roles carrying a hybrid model's recurrent state (disagg/prefill.py _send_state, disagg/decode.py
_write_state / _done) between two torch-free Schedulers joined by an in-memory link (messages encoded and
decoded as on the wire): the prefill's state slot of the request reaches the decode's state slot of its twin,
in order, in several chunks; a state of the wrong size fails the decode's request (503 naming the room) and the
prefill's; both allocators whole after."""

from __future__ import annotations

import struct

from fakes import expected_output
from radixlang_runtime.disagg import prefill as prefill_mod
from radixlang_runtime.disagg.decode import DecodeRole
from radixlang_runtime.disagg.prefill import PrefillRole
from radixlang_runtime.protocol.bootstrap_peers import Bootstrap
from radixlang_runtime.protocol.messages import decode, encode
from scheduler_utils import assert_whole, make, req

HOST = ("127.0.0.1", 8998)
STATE_BYTES = 40


class Link:
    def __init__(self, me):
        self.me, self.other, self.inbox = me, None, []

    def send(self, peer, msg):
        self.other.inbox.append((self.me, decode(encode(msg))))

    def receive(self, max_bytes=None):
        out, self.inbox = self.inbox, []
        return out

    def silent_for(self, peer):
        return 0.0


class KVPort:
    record_bytes = 24

    def __init__(self, runner):
        self.runner = runner

    def read_joined(self, slots):
        return b"".join(struct.pack("<qqq", *self.runner.slots[s]) for s in slots)

    def write_joined(self, slots, data):
        for s, rec in zip(slots, struct.iter_unpack("<qqq", data)):
            self.runner.slots[s] = rec


class StatePort:
    """State slots as bytes; the prefill's slot r holds its request's rid, padded (or `size` bytes long)."""

    def __init__(self, size=STATE_BYTES):
        self.state_bytes, self.size, self.slots, self.rids = STATE_BYTES, size, {}, {}

    def read_state(self, slot):
        return self.rids[slot].encode().ljust(self.size, b".")

    def write_state(self, slot, payload):
        assert len(payload) == self.state_bytes
        self.slots[slot] = payload


def _pair(prefill_state_bytes=STATE_BYTES):
    pre, pre_runner = make(page_size=4, chunk=16)
    dec, dec_runner = make(page_size=4, chunk=16)
    a, b = Link(HOST), Link("decode-1")
    a.other, b.other = b, a
    pre.pd = PrefillRole(a, KVPort(pre_runner), pre.kv, 30.0, 1.0)
    dec.pd = DecodeRole(b, KVPort(dec_runner), dec.kv, 30.0, 1.0, 8)
    pre.pd.state_port, dec.pd.state_port = StatePort(prefill_state_bytes), StatePort()
    return pre, dec


def _requests(rid, n, room):
    r = req(rid, n, 4)
    r.bootstrap = Bootstrap(*HOST, room)
    twin = req(rid, n, 4)
    twin.input_ids, twin.bootstrap = list(r.input_ids), r.bootstrap
    return r, twin


def _run(pre, dec):
    """Both sides stepped until idle: {(side, rid): finished request}, and the decode's state row of each rid."""
    done, rows = {}, {}
    for _ in range(2000):
        if pre.is_idle and dec.is_idle:
            return done, rows
        for s, side in ((pre, "p"), (dec, "d")):
            for r in s.step():
                if r.finished:
                    done[(side, r.rid)] = r
        for r in pre.running + [h.req for h in pre.pd.held.values()]:  # each prefill row's state names its request
            pre.pd.state_port.rids[r.table_idx] = r.rid
        rows.update((i.req.rid, i.req.table_idx) for i in dec.pd.incoming.values())
    raise AssertionError("did not drain")


def test_the_decode_installs_the_prefills_state_in_chunks(monkeypatch):
    monkeypatch.setattr(prefill_mod, "CHUNK_BYTES", 16)  # a 40-byte state in three chunks
    pre, dec = _pair()
    r, twin = _requests("s1", 30, room=5)
    pre.add_request(r)
    dec.add_request(twin)
    done, rows = _run(pre, dec)
    assert done[("d", "s1")].output_ids == expected_output(r.input_ids, 4)
    assert dec.pd.state_port.slots[rows["s1"]] == b"s1".ljust(STATE_BYTES, b".")
    assert_whole(pre)
    assert_whole(dec)


def test_a_state_of_the_wrong_size_fails_the_request():
    pre, dec = _pair(prefill_state_bytes=STATE_BYTES + 8)
    r, twin = _requests("s2", 12, room=6)
    pre.add_request(r)
    dec.add_request(twin)
    done, _ = _run(pre, dec)
    got = done[("d", "s2")]
    assert got.error_status == 503 and "malformed state chunk for room 6" in got.error
    assert done[("p", "s2")].error_status == 503
    assert not dec.pd.state_port.slots
    assert_whole(pre)
    assert_whole(dec)
