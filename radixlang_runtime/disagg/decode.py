"""DecodeRole (torch-free): the decode server's side of a PD transfer, hooked into the Scheduler.

A request (its `bootstrap` = (host, port, room)) never prefills here. It waits in the pre-allocation queue
(FIFO) until the pool can hold its prompt: then it takes its cached prefix from this server's radix cache
(locked; those positions are never sent), gets slots for the rest, and registers (PDRegister) with the
prefill's bootstrap socket. PDKVChunk messages are written into its slots (`port.write_joined`); PDDone
brings the first token (+ logprobs): the request is acked (PDAck) and handed to the Scheduler as "ready"
(kv_len == prompt length, one output token: it decodes from the next step like any running request).
On a CPU pool, while requests decode, a step takes at most step_bytes (STEP_BYTES) of K/V per active
transfer (a room that has received a chunk) from the link, whose flow control then slows the sender: a
long prompt's transfer costs the running streams a little on each of many steps instead of one long stall
(docs/DISAGGREGATION.md); transfers from several prefills at once get a budget each, so the decode's
intake grows with them. With nothing running, or step_bytes None (a device pool), it takes all that came.

Faults, each bounded: a request that waited transfer_timeout for pool room ("decode KV pool full"), a prefill
silent for heartbeat_timeout, no PDDone within transfer_timeout, PDFail from the prefill: the request ends
with a 503 error naming the cause; its slots are freed without caching (half-received K/V never enters the
radix cache), its cached prefix unlocked; the prefill gets PDCancel.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from radixlang_runtime.messages import PDAck, PDCancel, PDDone, PDFail, PDKVChunk, PDRegister
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.scheduler.request import Req

logger = logging.getLogger(__name__)
STEP_BYTES = 1 << 20  # CPU pool: K/V bytes written per step per active transfer while requests decode
IDLE_BUFFERED = 64 << 20  # K/V bytes the link reads ahead when a step may write all of it


@dataclass
class _Incoming:
    req: Req
    peer: tuple[str, int]  # the prefill's bootstrap (host, port)
    prefix_len: int  # positions from this server's radix cache
    since: float  # registration time: the bound on the whole transfer
    received: int = 0  # positions written so far (from prefix_len on, in order)


class DecodeRole:
    kind = "decode"

    def __init__(self, link: Any, port: Any, kv: KVManager, transfer_timeout: float, heartbeat_timeout: float,
                 max_running: int, clock: Callable[[], float] = time.monotonic,
                 step_bytes: Optional[int] = STEP_BYTES):
        self.link, self.port, self.kv = link, port, kv
        self.transfer_timeout, self.heartbeat_timeout, self.clock = transfer_timeout, heartbeat_timeout, clock
        self.max_running = max_running
        self.step_bytes = step_bytes
        self.queue: deque[tuple[Req, float]] = deque()  # waiting for pool room: (request, arrival)
        self.incoming: dict[int, _Incoming] = {}  # room -> registered request
        self.transferred_tokens = 0  # K/V positions received
        self.prefix_hit_tokens = 0  # positions served by this server's radix cache instead
        self.transfers_done = 0
        self.transfers_failed = 0

    # ------------------------------------------------------------------ scheduler hooks
    @property
    def pending(self) -> bool:
        return bool(self.queue or self.incoming)

    def held_reqs(self) -> list[Req]:
        return [i.req for i in self.incoming.values()]

    def add(self, req: Req) -> None:
        self.queue.append((req, self.clock()))

    def on_chunk(self, req: Req) -> None:  # decode servers run no prefill of their own requests' prompts
        return None

    def hold(self, req: Req) -> None:  # a retracted request recomputes here: it never gets this far
        raise AssertionError("DecodeRole.hold")

    def poll(self, n_running: int = 0) -> tuple[list[Req], list[Req]]:
        """Chunks and finals from prefills, liveness and timeouts, then pre-allocation. Returns (ended, ready)."""
        ended: list[Req] = []
        ready: list[Req] = []
        for _peer, msg in self.link.receive(self._budget(n_running)):
            inc = self.incoming.get(getattr(msg, "room", None))
            if inc is None:  # stale: a room that failed or was aborted
                continue
            why = None
            if isinstance(msg, PDKVChunk):
                why = self._write(inc, msg)
            elif isinstance(msg, PDDone):
                why = self._done(inc, msg)
                if why is None:
                    ready.append(inc.req)
            elif isinstance(msg, PDFail):
                why = f"the prefill server failed: {msg.message}"
            if why is not None:
                ended.append(self._fail(msg.room, why))
        now = self.clock()
        for room, inc in list(self.incoming.items()):
            # silence counts from the registration at the earliest (a restarted prefill was silent before it)
            if min(self.link.silent_for(inc.peer), now - inc.since) > self.heartbeat_timeout:
                ended.append(self._fail(room, f"the prefill server {inc.peer[0]}:{inc.peer[1]} is unreachable "
                                              f"(no heartbeat for {self.heartbeat_timeout:g} s)"))
            elif now - inc.since > self.transfer_timeout:
                ended.append(self._fail(room, f"the KV transfer of room {room} took over {self.transfer_timeout:g} s"))
        ended += self._preallocate(n_running)
        return ended, ready

    def take(self, rids: Iterable[str], failed: bool = False) -> list[Req]:
        """Aborts: the requests named leave the queue or their transfer (slots freed, the prefill told)."""
        rids = set(rids)
        out = [r for r, _ in self.queue if r.rid in rids]
        for r in out:  # never registered: the prefill is told directly
            self.link.send(tuple(r.bootstrap[:2]), PDCancel(r.bootstrap[2], "aborted on the decode server"))
        self.queue = deque((r, t) for r, t in self.queue if r.rid not in rids)
        for room, inc in list(self.incoming.items()):
            if inc.req.rid in rids:
                self._fail(room, "aborted on the decode server")
                out.append(inc.req)
        return out

    def take_all(self) -> list[Req]:
        return self.take([r.rid for r, _ in self.queue] + [i.req.rid for i in self.incoming.values()], failed=True)

    def stats(self) -> dict[str, Any]:
        return {"mode": "decode", "transferred_tokens": self.transferred_tokens,
                "prefix_hit_tokens": self.prefix_hit_tokens, "transfers_done": self.transfers_done,
                "transfers_failed": self.transfers_failed, "preallocation_queue": len(self.queue),
                "receiving": len(self.incoming)}

    # ------------------------------------------------------------------ internals
    def _budget(self, n_running: int) -> Optional[int]:
        """K/V bytes this step may write (None: all); the link buffers twice that ahead of the scheduler."""
        budget = None
        if n_running and self.step_bytes is not None:
            active = sum(inc.received > inc.prefix_len for inc in self.incoming.values())
            budget = self.step_bytes * max(1, active)
        if hasattr(self.link, "max_buffered"):
            self.link.max_buffered = IDLE_BUFFERED if budget is None else 2 * budget
        return budget

    def _preallocate(self, n_running: int) -> list[Req]:
        """FIFO: the head gets its slots when the pool (minus a page per running request) holds its prompt;
        requests that waited transfer_timeout fail."""
        ended = []
        now = self.clock()
        while self.queue:
            req, at = self.queue[0]
            if n_running + len(self.incoming) < self.max_running and self._allocate(req, n_running):
                self.queue.popleft()
                continue
            break
        keep = deque()
        for req, at in self.queue:
            if now - at > self.transfer_timeout:
                why = f"decode KV pool full: no room for {len(req.input_ids)} prompt tokens within " \
                      f"{self.transfer_timeout:g} s"
                req.finish({"type": "abort", "message": why})
                req.error, req.error_status = why, 503
                self.transfers_failed += 1
                self.link.send(tuple(req.bootstrap[:2]), PDCancel(req.bootstrap[2], why))  # the prefill stops too
                ended.append(req)
            else:
                keep.append((req, at))
        self.queue = keep
        return ended

    def _allocate(self, req: Req, n_running: int) -> bool:
        kv, n = self.kv, len(req.input_ids)
        if kv.table.available <= 0:
            return False
        kv.match(req, n + 1)  # the cached prefix of the whole prompt, locked
        p = req.kv_len
        need = kv.allocator.slots_needed(p, n - p)
        if need + (n_running + 1) * kv.page_size > kv.available_size():
            kv.unmatch(req)
            return False
        kv.assign_row(req)
        if n > p:
            kv.alloc(req, n - p)
        req.row_dirty = True
        req.admitted_at = time.perf_counter()
        host, port, room = req.bootstrap
        peer = (host, port)
        self.incoming[room] = _Incoming(req, peer, p, self.clock(), received=p)
        self.prefix_hit_tokens += p
        self.link.send(peer, PDRegister(room, p, n, self.port.record_bytes))
        return True

    def _write(self, inc: _Incoming, msg: PDKVChunk) -> Optional[str]:
        t = self.port.record_bytes
        count, rest = divmod(len(msg.payload), t)
        if rest or msg.start != inc.received or msg.start + count > len(inc.req.input_ids):
            return (f"malformed KV chunk for room {msg.room}: {len(msg.payload)} bytes at position {msg.start} "
                    f"(expected position {inc.received}, {t} bytes a token)")
        slots = inc.req.kv_indices[msg.start:msg.start + count]
        self.port.write_joined(slots, msg.payload)
        inc.received += count
        self.transferred_tokens += count
        return None

    def _done(self, inc: _Incoming, msg: PDDone) -> Optional[str]:
        req = inc.req
        if inc.received != len(req.input_ids):
            return f"room {msg.room}: the prefill finished after {inc.received} of {len(req.input_ids)} positions"
        del self.incoming[msg.room]
        self.link.send(inc.peer, PDAck(msg.room))
        self.transfers_done += 1
        req.cached_len = msg.cached_len
        if req.return_logprob:
            req.input_logprobs = list(msg.input_logprobs or [])
            req.input_top_logprobs = list(msg.input_top or [])
        if msg.first_token is None:  # max_new_tokens 0: nothing to decode
            req.finish({"type": "length", "length": 0})
            return None
        req.output_ids.append(msg.first_token)
        if req.return_logprob and msg.output_logprob is not None:
            req.output_logprobs.append(msg.output_logprob)
            if msg.output_top is not None:
                req.output_top_logprobs.append(msg.output_top)
        req.first_token_at = time.perf_counter()
        return None

    def _fail(self, room: int, why: str) -> Req:
        inc = self.incoming.pop(room)
        req = inc.req
        logger.warning("PD room %d (request %s) failed: %s", room, req.rid, why)
        self.kv.release(req, cache=False)  # half-received K/V never enters the radix cache
        self.link.send(inc.peer, PDCancel(room, why))
        req.finish({"type": "abort", "message": why})
        req.error, req.error_status = why, 503
        self.transfers_failed += 1
        return req
