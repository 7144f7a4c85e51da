"""Prefix pins (KVManager.pin / unpin / expire_pins): a pinned prefix survives eviction pressure that
takes everything else, unpin makes it evictable again, a ttl expires it, flush waits for it, and
check_integrity counts every lock. Torch-free unit tests on the fake runner, then one real Engine and
one real server showing run_batch's use: prefill, pin, traffic, unpin, whole."""

from __future__ import annotations

import random
import time

import httpx
import pytest

from radixlang_runtime.protocol.messages import PinPrefixOut, PinPrefixReq, UnpinPrefixOut, UnpinPrefixReq
from radixlang_runtime.scheduler.loop import RequestLoop
from scheduler_utils import assert_whole, drain, make, req


def ids(seed: str, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 90) for _ in range(n)]


def run(sched, *reqs):
    for r in reqs:
        sched.add_request(r)
    return drain(sched)


def with_prompt(rid: str, prompt: list[int], max_new: int):
    r = req(rid, 0, max_new)
    r.input_ids = list(prompt)
    return r


# ---------------------------------------------------------------------- KVManager, fake runner
@pytest.mark.parametrize("page_size", [1, 16])
def test_pinned_prefix_survives_pressure_and_unpin_makes_it_evictable(page_size):
    sched, _ = make(num_slots=512, page_size=page_size)
    kv = sched.kv
    prefix = ids("prefix", 64)
    run(sched, with_prompt("a", prefix + ids("tail", 40), 4))  # caches prefix + tail
    pin_id, pinned_len = kv.pin(prefix)
    assert pinned_len == 64 and kv.pin_stats() == {"pinned_slots": 64, "num_pins": 1}
    sched.check_integrity()

    # traffic that needs the whole pool (minus the pin): everything unpinned is evicted
    run(sched, *[req(f"big{i}", 400, 8) for i in range(3)])
    kv.ensure_free(kv.allocator.total_slots)
    assert kv.cached_size() == kv.pinned_slots() == 64
    assert kv.radix.match_prefix(prefix + ids("tail", 40)).length == 64  # the tail went, the pin stayed
    assert sched.flush_cache() is False  # locked by the pin
    sched.check_integrity()

    later = with_prompt("c", prefix + ids("other", 30), 4)
    run(sched, later)
    assert later.cached_len == 64
    sched.check_integrity()

    assert kv.unpin(pin_id) is True and kv.unpin(pin_id) is False
    assert kv.pin_stats() == {"pinned_slots": 0, "num_pins": 0}
    kv.ensure_free(kv.allocator.total_slots)
    assert kv.cached_size() == 0
    assert sched.flush_cache() is True
    assert_whole(sched)


def test_pin_locks_only_what_is_cached_and_counts_overlaps_once():
    sched, _ = make(num_slots=512, page_size=16)
    kv = sched.kv
    assert kv.pin(ids("nothing", 50))[1] == 0  # nothing cached: a pin with nothing locked
    prefix = ids("p", 100)
    run(sched, with_prompt("a", prefix, 1))
    p1, n1 = kv.pin(prefix + ids("x", 20))  # only the cached, page-aligned part
    p2, n2 = kv.pin(prefix[:48])
    assert (n1, n2) == (96, 48)
    assert kv.pin_stats() == {"pinned_slots": 96, "num_pins": 3}
    sched.check_integrity()
    kv.unpin(p1)
    assert kv.pinned_slots() == 48
    kv.ensure_free(kv.allocator.total_slots)
    assert kv.cached_size() == 48
    sched.check_integrity()
    for pid in list(kv.pins):
        kv.unpin(pid)
    assert_whole(sched)


def test_pins_together_lock_at_most_half_the_pool():
    sched, _ = make(num_slots=256, page_size=16)
    kv = sched.kv
    prefix = ids("long", 200)
    run(sched, with_prompt("a", prefix, 1))
    first, n1 = kv.pin(prefix)
    second, n2 = kv.pin(prefix)  # the same path costs nothing more
    assert n1 == n2 == 128 and kv.pinned_slots() == 128
    other = ids("other", 40)
    run(sched, with_prompt("b", other, 1))
    assert kv.pin(other)[1] == 0  # the cap is reached
    sched.check_integrity()
    for pid in list(kv.pins):
        kv.unpin(pid)
    assert_whole(sched)


def test_expired_pins_are_dropped():
    sched, _ = make(num_slots=256)
    kv = sched.kv
    prefix = ids("p", 30)
    run(sched, with_prompt("a", prefix, 1))
    pid, _ = kv.pin(prefix, ttl_s=5, now=100.0)
    keep, _ = kv.pin(prefix)  # no ttl: until unpin
    assert kv.expire_pins(now=104.9) == []
    assert kv.expire_pins(now=105.0) == [pid] and list(kv.pins) == [keep]
    sched.check_integrity()
    kv.unpin(keep)
    for bad in (0, -1, float("inf"), "5", 1e300, 86400.5):
        with pytest.raises(ValueError, match="ttl_s"):
            kv.pin(prefix, ttl_s=bad)
    day, _ = kv.pin(prefix, ttl_s=86400)  # the bound itself is allowed
    kv.unpin(day)
    assert_whole(sched)


def test_pin_ids_are_unguessable_and_only_their_owner_unpins():
    sched, _ = make(num_slots=256)
    kv = sched.kv
    prefix = ids("p", 30)
    run(sched, with_prompt("a", prefix, 1))
    mine, _ = kv.pin(prefix, owner="alice")
    other, _ = kv.pin(prefix, owner="alice")
    assert mine != other and len(mine) == len("pin-") + 32 and int(mine[4:], 16) >= 0  # 128 random bits
    assert kv.unpin(mine) is False and kv.unpin(mine, "mallory") is False  # not theirs: as if unknown
    assert mine in kv.pins
    assert kv.unpin(mine, "alice") is True and kv.unpin(mine, "alice") is False
    assert kv.unpin("pin-1", "alice") is False
    kv.unpin(other, "alice")
    sched.check_integrity()
    assert_whole(sched)


def test_check_integrity_counts_every_lock():
    sched, _ = make(num_slots=256)
    prefix = ids("p", 30)
    run(sched, with_prompt("a", prefix, 1))
    node = sched.kv.radix.match_prefix(prefix).last_node
    sched.kv.radix.lock(node)  # a lock nobody holds: a leak
    with pytest.raises(AssertionError, match="lock_ref"):
        sched.check_integrity()
    sched.kv.radix.unlock(node)
    assert_whole(sched)


def test_without_radix_cache_a_pin_locks_nothing():
    sched, _ = make(radix=False)
    pid, n = sched.kv.pin(ids("p", 30))
    assert n == 0 and sched.kv.pin_stats() == {"pinned_slots": 0, "num_pins": 1}
    assert sched.kv.unpin(pid) and sched.flush_cache()


class ListIO:
    def __init__(self, msgs):
        self.inbox, self.control = list(msgs), []

    def receive(self, timeout):
        out, self.inbox = self.inbox, []
        return out

    def send_tokens(self, out):
        pass

    def send_error(self, rids, message, status=500):
        pass

    def send_control(self, msg):
        self.control.append(msg)


def test_request_loop_answers_pin_messages_and_expires_pins():
    sched, _ = make(num_slots=256)
    prefix = ids("p", 30)
    run(sched, with_prompt("a", prefix, 1))
    io = ListIO([PinPrefixReq("q1", prefix, 0.05), PinPrefixReq("q2", prefix, None), PinPrefixReq("q3", prefix, -1)])
    loop = RequestLoop(sched, io, idle_wait=0.0)
    loop.run_once()
    short, long_, bad = io.control
    assert short == PinPrefixOut("q1", short.pin_id, 30) and long_.pinned_len == 30
    assert bad.pin_id is None and "ttl_s" in bad.error
    time.sleep(0.06)
    loop.run_once()  # an idle iteration drops the expired pin
    assert list(sched.kv.pins) == [long_.pin_id]
    io.inbox = [UnpinPrefixReq("u1", long_.pin_id), UnpinPrefixReq("u2", short.pin_id)]
    loop.run_once()
    assert io.control[3:] == [UnpinPrefixOut("u1", True), UnpinPrefixOut("u2", False)]
    assert_whole(sched)


def test_the_zmq_frontend_unpins_a_vanished_clients_pins():
    import asyncio
    import types

    from radixlang_runtime.protocol.messages import FrontendReq
    from radixlang_runtime.server.frontend_zmq import FrontendServer

    class TM:  # what FrontendServer needs of the TokenizerManager
        def __init__(self):
            self.pinned: set[str] = set()

        def encode_text(self, text):
            return [ord(c) for c in text]

        async def run_intake(self, fn, *args, size=0):
            return fn(*args)

        async def pin_prefix(self, input_ids, ttl_s=None, owner=""):
            pid = f"pin-{len(self.pinned) + 1}"
            self.pinned.add(pid)
            return {"pin_id": pid, "pinned_len": len(input_ids), "input_len": len(input_ids)}

        async def unpin_prefix(self, pin_id, owner=""):
            had = pin_id in self.pinned
            self.pinned.discard(pin_id)
            return had

    async def main():
        tm = TM()
        fs = FrontendServer("inproc://pin-test", types.SimpleNamespace(routes=[]), tm, None)
        try:
            await fs._pin(b"gone", FrontendReq("r1", "pin_prefix", {"text": "abc"}))
            await fs._pin(b"alive", FrontendReq("r2", "pin_prefix", {"text": "abcd"}))
            assert (await fs._outbox.get())[1].body == {"pin_id": "pin-1", "pinned_len": 3, "input_len": 3}
            fs._forget_client(b"gone")  # what the janitor does after CLIENT_TIMEOUT_S without a ping
            await asyncio.wait_for(asyncio.gather(*list(fs._unpinning)), 5)
            assert tm.pinned == {"pin-2"}
        finally:
            await fs.close()

    asyncio.run(main())


# ---------------------------------------------------------------------- real model
PREFIX_LEN = 160  # a whole number of pages (page size 1 or 16)


def batch_prompts(vocab: int = 30000) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """(the shared prefix, 6 batch prompts = prefix + distinct suffix, 3 long unrelated prompts)."""
    rng = random.Random("pin-e2e")
    prefix = [rng.randrange(100, vocab) for _ in range(PREFIX_LEN)]
    prompts = [prefix + [1000 + i] + [rng.randrange(100, vocab) for _ in range(40)] for i in range(6)]
    flood = [[rng.randrange(100, vocab) for _ in range(600)] for _ in range(3)]
    return prefix, prompts, flood


@pytest.mark.slow
def test_engine_pin_keeps_the_prefix_under_a_tight_pool():
    from conftest import assert_whole as engine_whole
    from radixlang_runtime import Engine

    with Engine(dtype="float32", max_total_tokens=1024, debug_check_integrity=True) as eng:
        prefix, prompts, flood = batch_prompts()
        greedy = {"max_new_tokens": 8, "temperature": 0}
        eng.generate(input_ids=prefix, sampling_params={"max_new_tokens": 0})
        pin = eng.pin_prefix(input_ids=prefix)
        assert pin["pinned_len"] == PREFIX_LEN == pin["input_len"]
        eng.generate(input_ids=flood, sampling_params=greedy)  # needs the pool: evicts all but the pin
        outs = eng.generate(input_ids=prompts, sampling_params=[greedy] * len(prompts))
        assert [o["meta_info"]["cached_tokens"] for o in outs] == [PREFIX_LEN] * len(prompts)
        st = eng.get_stats()
        assert (st["num_pins"], st["pinned_slots"]) == (1, PREFIX_LEN)
        assert eng.flush_cache() is False
        assert eng.unpin_prefix(pin["pin_id"]) is True and eng.unpin_prefix(pin["pin_id"]) is False
        assert eng.flush_cache() is True
        engine_whole(eng)
        assert eng.get_stats()["free_slots"] == eng.get_stats()["total_slots"]


@pytest.mark.slow
def test_server_pin_routes_under_a_tight_pool():
    from server_utils import ServerProcess

    srv = ServerProcess("--dtype", "float32", "--max-total-tokens", "1024", "--api-key", "k",
                        "--debug-check-integrity")
    try:
        with httpx.Client(base_url=srv.url, timeout=120, headers={"Authorization": "Bearer k"}) as c:
            assert httpx.post(srv.url + "/pin_prefix", json={"input_ids": [1]}, timeout=120).status_code == 401
            for bad in ({}, {"text": "a", "input_ids": [1]}, {"input_ids": "x"}, {"text": "a", "ttl_s": 0}):
                r = c.post("/pin_prefix", json=bad)
                assert r.status_code == 400 and r.json()["error"]["message"], (bad, r.text)
            r = c.post("/pin_prefix", json={"text": "a", "ttl_s": 1e300})  # a pin for ever: refused by name
            assert r.status_code == 400 and r.json()["error"]["param"] == "ttl_s", r.text
            prefix, prompts, flood = batch_prompts()
            greedy = {"max_new_tokens": 8, "temperature": 0}
            assert c.post("/generate", json={"input_ids": prefix, "sampling_params": {"max_new_tokens": 0}}).is_success
            pin = c.post("/pin_prefix", json={"input_ids": prefix}).json()
            assert pin["pinned_len"] == PREFIX_LEN, pin
            assert c.post("/generate", json={"input_ids": flood, "sampling_params": greedy}).is_success
            outs = c.post("/generate", json={"input_ids": prompts, "sampling_params": greedy}).json()
            assert [o["meta_info"]["cached_tokens"] for o in outs] == [PREFIX_LEN] * len(prompts)
            stats = c.get("/server_info").json()["stats"]
            assert (stats["num_pins"], stats["pinned_slots"]) == (1, PREFIX_LEN)
            assert c.post("/flush_cache").status_code == 400
            assert c.post("/unpin_prefix", json={"pin_id": pin["pin_id"]}).json() == {"pin_id": pin["pin_id"],
                                                                                      "success": True}
            gone = c.post("/unpin_prefix", json={"pin_id": pin["pin_id"]})
            assert gone.status_code == 404 and gone.json()["error"]["param"] == "pin_id", gone.text
            assert c.post("/flush_cache").status_code == 200
            stats = c.get("/server_info").json()["stats"]
            assert stats["num_pins"] == 0 and stats["free_slots"] == stats["total_slots"], stats
    finally:
        assert srv.stop() in (0, 143), srv.tail()
