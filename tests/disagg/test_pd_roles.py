"""PD roles (disagg/prefill.py, disagg/decode.py) between two torch-free Schedulers: a prefill scheduler and a
decode scheduler, each with its FakeRunner, joined by an in-memory link; the "KV" moved is the prefill
runner's per-slot (position, token, history hash) records, so the decode runner's own check ("KV slot holds
foreign data") verifies every transferred position. Faults: a silent peer, a missing registration, a full
decode pool, aborts; both allocators whole after each (check_integrity)."""

from __future__ import annotations

import struct

import pytest

from fakes import expected_output
from radixlang_runtime.disagg.decode import DecodeRole
from radixlang_runtime.disagg.prefill import PrefillRole
from radixlang_runtime.protocol.bootstrap_peers import Bootstrap
from radixlang_runtime.protocol.messages import PDKVChunk, decode, encode
from scheduler_utils import assert_whole, make, req

HOST = ("127.0.0.1", 8998)


class FakeLink:
    """One side of an in-memory link; messages go through encode/decode as on the wire."""

    def __init__(self, me_as_seen: object):
        self.me = me_as_seen  # how the other side names this one
        self.other: "FakeLink" = None
        self.inbox: list = []
        self.silent: dict = {}  # peer -> seconds of silence to report
        self.cut = False  # messages to the other side are lost

    def send(self, peer, msg) -> None:
        if not self.cut:
            self.other.inbox.append((self.me, decode(encode(msg))))

    def receive(self, max_bytes=None) -> list:
        """As the real link: with max_bytes, chunks up to that many payload bytes (at least one message)."""
        n, taken = 0, 0
        for _, m in self.inbox:
            size = len(m.payload) if isinstance(m, PDKVChunk) else 0
            if n and max_bytes is not None and taken + size > max_bytes:
                break
            n, taken = n + 1, taken + size
        out, self.inbox = self.inbox[:n], self.inbox[n:]
        return out

    def silent_for(self, peer) -> float:
        return self.silent.get(peer, 0.0)


class FakePort:
    """KVRecordPort's joined interface (what PD calls) over a FakeRunner's slot records: 24 bytes a token."""

    record_bytes = 24

    def __init__(self, runner):
        self.runner = runner

    def read_joined(self, slots):
        return b"".join(struct.pack("<qqq", *self.runner.slots[s]) for s in slots)

    def write_joined(self, slots, data):
        assert len(data) == len(slots) * self.record_bytes
        for s, rec in zip(slots, struct.iter_unpack("<qqq", data)):
            self.runner.slots[s] = rec


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def pair(decode_slots=4096, page_size=4, chunk=16, timeout=30.0, step_bytes=None):
    clock = Clock()
    pre, pre_runner = make(page_size=page_size, chunk=chunk)
    dec, dec_runner = make(num_slots=decode_slots, page_size=page_size, chunk=chunk)
    a, b = FakeLink(HOST), FakeLink("decode-1")  # each named as the other side sees it
    a.other, b.other = b, a
    pre.pd = PrefillRole(a, FakePort(pre_runner), pre.kv, timeout, 1.0, clock)
    dec.pd = DecodeRole(b, FakePort(dec_runner), dec.kv, timeout, 1.0, 8, clock, step_bytes=step_bytes)
    return pre, dec, clock


def pd_req(rid, n_prompt, max_new, room, seed=0, **sp):
    r = req(rid, n_prompt, max_new, seed, **sp)
    r.bootstrap = Bootstrap(*HOST, room)
    return r


def twin(r):
    c = req(r.rid, len(r.input_ids), r.sampling.max_new_tokens)
    c.input_ids, c.bootstrap = list(r.input_ids), r.bootstrap
    return c


def run(pre, dec, limit=2000):
    done = {}
    for _ in range(limit):
        if pre.is_idle and dec.is_idle:
            return done
        for s, side in ((pre, "p"), (dec, "d")):
            for r in s.step():
                if r.finished:
                    done[(side, r.rid)] = r
    raise AssertionError("did not drain")


@pytest.mark.parametrize("page_size", [1, 4])
def test_decode_output_matches_colocated_and_prefix_is_not_resent(page_size):
    pre, dec, _ = pair(page_size=page_size)
    reqs = [pd_req(f"r{i}", 10 + 13 * i, 6, room=100 + i) for i in range(4)]  # up to 49 tokens: chunked
    for r in reqs:
        pre.add_request(r)
        dec.add_request(twin(r))
    done = run(pre, dec)
    for r in reqs:
        want = expected_output(r.input_ids, 6)
        assert done[("p", r.rid)].output_ids == want[:1] and done[("p", r.rid)].error is None
        assert done[("d", r.rid)].output_ids == want, r.rid
    assert dec.pd.transferred_tokens == sum(len(r.input_ids) for r in reqs)
    assert pre.pd.transfers_done == dec.pd.transfers_done == 4
    # the same prompt again: the decode's radix cache has it, only what is past the cached pages comes
    again = pd_req("again", 10, 3, room=7, seed=0)
    again.input_ids = list(reqs[3].input_ids)
    before = dec.pd.transferred_tokens
    pre.add_request(again)
    dec.add_request(twin(again))
    done = run(pre, dec)
    assert done[("d", "again")].output_ids == expected_output(again.input_ids, 3)
    assert dec.pd.transferred_tokens - before < page_size + 1
    assert_whole(pre)
    assert_whole(dec)


def test_chunks_stream_before_the_first_token():
    pre, dec, _ = pair(chunk=16)
    r = pd_req("long", 60, 2, room=1)
    pre.add_request(r)
    dec.add_request(twin(r))
    dec.step()  # registers
    chunks = []
    orig = dec.pd.link.receive

    def spy(max_bytes=None):
        got = orig(max_bytes)
        chunks.extend(m for _, m in got if isinstance(m, PDKVChunk))
        return got

    dec.pd.link.receive = spy
    pre.step()  # first chunk of 16: streamed at once
    dec.step()
    assert [c.start for c in chunks] == [0]
    run(pre, dec)
    assert [c.start for c in chunks][:4] == [0, 16, 32, 48]
    assert_whole(pre)
    assert_whole(dec)


def test_silent_prefill_fails_decode_request_and_frees_its_slots():
    pre, dec, clock = pair()
    r = pd_req("x", 40, 4, room=9)
    pre.add_request(r)
    dec.add_request(twin(r))
    dec.step()
    pre.step()  # one chunk sent
    dec.step()
    assert dec.pd.transferred_tokens == 16
    dec.pd.link.silent[HOST] = 1.5
    assert not [q for q in dec.step() if q.finished]  # registered just now: silence counts from then
    clock.t = 1.5
    ended = [q for q in dec.step() if q.finished]
    assert ended[0].error.startswith("the prefill server 127.0.0.1:8998 is unreachable")
    assert ended[0].error_status == 503
    assert_whole(dec)  # half-received K/V freed, never cached
    assert dec.kv.cached_size() == 0
    # the prefill hears the decode's cancel and ends its request too
    done = run(pre, dec)
    assert "unreachable" in done[("p", "x")].error
    assert_whole(pre)


def test_silent_decode_fails_prefill_request():
    pre, dec, _ = pair()
    r = pd_req("y", 20, 4, room=3)
    pre.add_request(r)
    dec.add_request(twin(r))
    dec.step()
    dec.pd.link.cut = True  # the decode is gone
    pre.pd.link.silent["decode-1"] = 2.0
    out = []
    for _ in range(10):
        out += [q for q in pre.step() if q.finished]
    assert len(out) == 1 and "decode server of room 3 is unreachable" in out[0].error
    assert out[0].error_status == 503
    assert_whole(pre)


def test_prefill_without_registration_fails_after_the_timeout():
    pre, _, clock = pair(timeout=5.0)
    pre.add_request(pd_req("z", 8, 2, room=4))
    for _ in range(3):
        pre.step()
    assert pre.pd.pending and not pre.is_idle
    clock.t = 6.0
    out = [q for q in pre.step() if q.finished]
    assert "no decode server registered room 4 within 5 s" in out[0].error
    assert_whole(pre)


def test_full_decode_pool_waits_then_fails():
    pre, dec, clock = pair(decode_slots=64, timeout=5.0)
    big = pd_req("big", 40, 12, room=1)
    second = pd_req("second", 40, 2, room=2)
    for r in (big, second):
        pre.add_request(r)
        dec.add_request(twin(r))
    dec.step()
    assert len(dec.pd.incoming) == 1 and len(dec.pd.queue) == 1  # flow control: the second waits
    for _ in range(20):  # big's K/V arrives; second still does not fit beside it
        pre.step()
        dec.step()
        if dec.running:
            break
    assert dec.running and len(dec.pd.queue) == 1
    clock.t = 6.0
    out = [q for q in dec.step() if q.finished]
    assert [q.rid for q in out] == ["second"] and "decode KV pool full" in out[0].error
    done = run(pre, dec)
    assert done[("d", "big")].output_ids == expected_output(big.input_ids, 12)
    assert "decode KV pool full" in done[("p", "second")].error  # the decode's cancel reached the prefill
    assert_whole(pre)
    assert_whole(dec)


def test_abort_on_decode_mid_transfer():
    pre, dec, _ = pair()
    r = pd_req("ab", 40, 4, room=5)
    pre.add_request(r)
    dec.add_request(twin(r))
    dec.step()
    pre.step()
    dec.abort("ab")
    out = [q for q in dec.step() if q.finished]
    assert out[0].finished_reason["type"] == "abort"
    assert_whole(dec)
    done = run(pre, dec)
    assert done[("p", "ab")].error is not None
    assert_whole(pre)


def test_step_budget_per_active_transfer_on_a_cpu_pool_only():
    from radixlang_runtime.disagg.decode import IDLE_BUFFERED, STEP_BYTES, _Incoming

    class Link:
        max_buffered = 0

    role = DecodeRole(Link(), None, None, 30.0, 1.0, 8)
    assert role._budget(n_running=0) is None and role.link.max_buffered == IDLE_BUFFERED  # nothing decodes
    role.incoming = {1: _Incoming(None, ("h", 1), prefix_len=16, since=0.0, received=16)}  # registered, no chunk yet
    assert role._budget(n_running=3) == STEP_BYTES and role.link.max_buffered == 2 * STEP_BYTES
    role.incoming[1].received = 60
    role.incoming[2] = _Incoming(None, ("h", 2), prefix_len=0, since=0.0, received=5)
    assert role._budget(n_running=3) == 2 * STEP_BYTES  # two transfers under way: a budget each
    assert role.link.max_buffered == 4 * STEP_BYTES
    device = DecodeRole(Link(), None, None, 30.0, 1.0, 8, step_bytes=None)  # a device pool: never throttled
    device.incoming = dict(role.incoming)
    assert device._budget(n_running=3) is None and device.link.max_buffered == IDLE_BUFFERED


def test_a_transfer_is_written_over_several_steps_while_others_decode():
    pre, dec, _ = pair(chunk=16, step_bytes=24)  # one token's record a step: one message a step
    first = pd_req("first", 8, 40, room=1)
    pre.add_request(first)
    dec.add_request(twin(first))
    for _ in range(50):  # until the first request decodes on the decode server
        pre.step()
        dec.step()
        if dec.running:
            break
    assert dec.running
    long = pd_req("long", 64, 2, room=2)
    pre.add_request(long)
    dec.add_request(twin(long))
    per_step = []
    orig = dec.pd.link.receive

    def spy(max_bytes=None):
        got = orig(max_bytes)
        per_step.append([m.start for _, m in got if isinstance(m, PDKVChunk)])
        return got

    dec.pd.link.receive = spy
    dec.step()  # registers "long" (and decodes "first")
    for _ in range(8):  # the prefill computes all of "long" and queues every chunk before the decode looks again
        pre.step()
    assert sum(isinstance(m, PDKVChunk) for _, m in dec.pd.link.inbox) >= 3
    done = run(pre, dec)
    chunky = [starts for starts in per_step if starts]
    # the queued chunks are taken one a step while "first" decodes, never all at once
    assert len(chunky) >= 3 and all(len(starts) == 1 for starts in chunky)
    assert [s for starts in chunky for s in starts] == sorted(s for starts in chunky for s in starts)
    assert done[("d", "long")].output_ids == expected_output(long.input_ids, 2)
    assert done[("d", "first")].output_ids == expected_output(first.input_ids, 40)
    assert_whole(pre)
    assert_whole(dec)
