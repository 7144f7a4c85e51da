"""DecodeRole (torch-free): the decode server's side of a PD transfer, hooked into the Scheduler.

A request (its `bootstrap`: host, port, room) never prefills here. It waits in the pre-allocation queue
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

Strangers (docs/DISAGGREGATION.md, "Security"): the bookkeeping is keyed by (peer, room), peer the
prefill's (host, port) the request named: a message counts only when it comes from the socket of the
peer its room registered with (else it is dropped and counted); a second request naming a (peer, room)
in flight is refused with 400 naming the room (nothing allocated); PDDone's first token must be in the
vocabulary and its other fields fit the request, PDKVChunk's positions the slots: a forged one fails its
request only. A peer's socket is closed once no request uses it and it is dead (silent for
heartbeat_timeout) or idle for PEER_IDLE_S. A link whose thread stays down raises FatalFault here.

Faults, each bounded: a request that waited transfer_timeout for pool room ("decode KV pool full"), a prefill
silent for heartbeat_timeout, no PDDone within transfer_timeout, PDFail from the prefill: the request ends
with a 503 error naming the cause; its slots are freed without caching (half-received K/V never enters the
radix cache), its cached prefix unlocked; the prefill gets PDCancel. A hybrid model's recurrent state after the
prompt comes as PDKVChunk messages flagged `state` (bytes in order) and is written into the request's state slot
at PDDone (`state_port`, mem/state_records.py); a state of the wrong size fails the request.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from radixlang_runtime.disagg.adapters import PDAdapters
from radixlang_runtime.disagg.link import dropped_stats
from radixlang_runtime.utils.faults import FatalFault
from radixlang_runtime.protocol.messages import PDAck, PDCancel, PDDone, PDFail, PDKVChunk, PDRegister
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.scheduler.request import Req

logger = logging.getLogger(__name__)
STEP_BYTES = 1 << 20  # CPU pool: K/V bytes written per step per active transfer while requests decode
IDLE_BUFFERED = 64 << 20  # K/V bytes the link reads ahead when a step may write all of it
PEER_IDLE_S = 60.0  # a live prefill's socket is kept this long after its last request
Key = tuple  # (peer, room): peer the prefill's (host, port)


@dataclass
class _Incoming:
    req: Req
    peer: tuple[str, int]  # the prefill's bootstrap (host, port)
    prefix_len: int  # positions from this server's radix cache
    since: float  # registration time: the bound on the whole transfer
    received: int = 0  # positions written so far (from prefix_len on, in order)
    state: bytearray = field(default_factory=bytearray)  # a hybrid model's recurrent state received so far


class DecodeRole:
    kind = "decode"

    def __init__(self, link: Any, port: Any, kv: KVManager, transfer_timeout: float, heartbeat_timeout: float,
                 max_running: int, clock: Callable[[], float] = time.monotonic,
                 step_bytes: Optional[int] = STEP_BYTES, vocab_size: Optional[int] = None,
                 adapters: Optional[PDAdapters] = None):
        self.link, self.port, self.kv = link, port, kv
        self.adapters = adapters or PDAdapters(lambda i: None, lambda i: None)  # LoRA identities (adapters.py)
        self._lora_wait: Optional[Req] = None  # the queue's head, held back by its LoRA adapter (not the pool)
        self.transfer_timeout, self.heartbeat_timeout, self.clock = transfer_timeout, heartbeat_timeout, clock
        self.max_running = max_running
        self.step_bytes = step_bytes
        self.queue: deque[tuple[Req, float]] = deque()  # waiting for pool room: (request, arrival)
        self.vocab_size = vocab_size  # a first token must be below it (None: unchecked)
        self.incoming: dict[Key, _Incoming] = {}  # (peer, room) -> registered request
        self._queued: set[Key] = set()  # (peer, room) of the queue's requests
        self._refused: list[Req] = []  # duplicates refused by add(), returned by the next poll
        self._users: Counter = Counter()  # peer -> requests queued or registered with it
        self._idle: dict[Any, float] = {}  # peer -> when its last request left
        self.dropped: Counter = Counter()  # messages the role dropped, by reason
        self.transferred_tokens = 0  # K/V positions received
        self.prefix_hit_tokens = 0  # positions served by this server's radix cache instead
        self.transfers_done = 0
        self.transfers_failed = 0
        self.state_port: Any = None  # hybrid models: the state pool's (mem/state_records.py); installed at PDDone

    # ------------------------------------------------------------------ scheduler hooks
    @property
    def pending(self) -> bool:
        return bool(self.queue or self.incoming)

    def held_reqs(self) -> list[Req]:
        return [i.req for i in self.incoming.values()]

    def add(self, req: Req) -> bool:
        """A new request waits for pool room (False: the scheduler does not queue it for prefill); one naming
        a (peer, room) in flight is refused with 400 (returned ended by the next poll, nothing allocated)."""
        key = _key(req)
        if key in self._queued or key in self.incoming:
            why = (f"bootstrap_room {key[1]} is already in flight from {key[0][0]}:{key[0][1]} on this decode "
                   "server (rooms must be unique)")
            req.finish({"type": "abort", "message": why})
            req.error, req.error_status = why, 400
            self._refused.append(req)
            return False
        self.queue.append((req, self.clock()))
        self._queued.add(key)
        self._use(key[0])
        return False

    def on_chunk(self, req: Req) -> None:  # decode servers run no prefill of their own requests' prompts
        return None

    def hold(self, req: Req) -> None:  # a retracted request recomputes here: it never gets this far
        raise AssertionError("DecodeRole.hold")

    def poll(self, n_running: int = 0) -> tuple[list[Req], list[Req]]:
        """Chunks and finals from prefills, liveness and timeouts, then pre-allocation. Returns (ended, ready)."""
        if (problem := getattr(self.link, "problem", None)) is not None:
            raise FatalFault(problem)
        ended: list[Req] = self._refused
        self._refused = []
        ready: list[Req] = []
        for peer, msg in self.link.receive(self._budget(n_running)):
            inc = self.incoming.get((peer, getattr(msg, "room", None)))
            if inc is None:  # a room that failed or was aborted, or a message from a peer it never named
                self.dropped["unmatched"] += 1
                continue
            why = None
            if isinstance(msg, PDKVChunk):
                why = self._write_state(inc, msg) if msg.state else self._write(inc, msg)
            elif isinstance(msg, PDDone):
                why = self._done(inc, msg)
                if why is None:
                    ready.append(inc.req)
            elif isinstance(msg, PDFail):
                why = f"the prefill server failed: {msg.message[:500]}"
            if why is not None:
                ended.append(self._fail((peer, msg.room), why))
        now = self.clock()
        for key, inc in list(self.incoming.items()):
            # silence counts from the registration at the earliest (a restarted prefill was silent before it)
            if min(self.link.silent_for(inc.peer), now - inc.since) > self.heartbeat_timeout:
                ended.append(self._fail(key, f"the prefill server {inc.peer[0]}:{inc.peer[1]} is unreachable "
                                             f"(no heartbeat for {self.heartbeat_timeout:g} s)"))
            elif now - inc.since > self.transfer_timeout:
                ended.append(self._fail(key, f"the KV transfer of room {key[1]} took over "
                                             f"{self.transfer_timeout:g} s"))
        ended += self._preallocate(n_running)
        self._close_idle_peers(now)
        return ended, ready

    def take(self, rids: Iterable[str], failed: bool = False) -> list[Req]:
        """Aborts: the requests named leave the queue or their transfer (slots freed, the prefill told)."""
        rids = set(rids)
        out = [r for r, _ in self.queue if r.rid in rids]
        for r in out:  # never registered: the prefill is told directly
            self.link.send(r.bootstrap.peer, PDCancel(r.bootstrap.room, "aborted on the decode server"))
            self._unqueue(r)
        self.queue = deque((r, t) for r, t in self.queue if r.rid not in rids)
        for key, inc in list(self.incoming.items()):
            if inc.req.rid in rids:
                self._fail(key, "aborted on the decode server")
                out.append(inc.req)
        return out

    def take_all(self) -> list[Req]:
        return self.take([r.rid for r, _ in self.queue] + [i.req.rid for i in self.incoming.values()], failed=True)

    def stats(self) -> dict[str, Any]:
        return {"mode": "decode", "transferred_tokens": self.transferred_tokens,
                "prefix_hit_tokens": self.prefix_hit_tokens, "transfers_done": self.transfers_done,
                "transfers_failed": self.transfers_failed, "preallocation_queue": len(self.queue),
                "receiving": len(self.incoming), "peer_sockets": len(self._users) + len(self._idle),
                **dropped_stats(self.link, self.dropped)}

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
        """FIFO: the head gets its slots when its LoRA adapter may join the batch and the pool (minus a page per
        running request) holds its prompt; requests that waited transfer_timeout fail."""
        ended = []
        now = self.clock()
        self._lora_wait = None
        while self.queue:
            req, at = self.queue[0]
            if n_running + len(self.incoming) >= self.max_running:
                break
            try:
                lora_ok = self.adapters.ready(req.lora_id, {i.req.lora_id for i in self.incoming.values()})
                ident = self.adapters.identity(req.lora_id)
                if ident is None:
                    raise ValueError(f"{self.adapters.describe(req.lora_id)}'s files cannot be read: no identity "
                                     "to check the prefill's K/V against")
            except ValueError as e:  # the adapter cannot be read: this request ends (400 naming it)
                self.queue.popleft()
                ended.append(self._refuse(req, str(e), 400))
                continue
            if not lora_ok:
                self._lora_wait = req
                break
            if self._allocate(req, n_running, ident):
                self.queue.popleft()
                self._queued.discard(_key(req))
                continue
            break
        keep = deque()
        for req, at in self.queue:
            if now - at > self.transfer_timeout:
                why = f"decode KV pool full: no room for {len(req.input_ids)} prompt tokens within " \
                      f"{self.transfer_timeout:g} s"
                if req is self._lora_wait:
                    why = (f"{self.adapters.describe(req.lora_id)} could not join the running batch within "
                           f"{self.transfer_timeout:g} s (--max-loras-per-batch / --max-loaded-loras)")
                ended.append(self._refuse(req, why, 503))
            else:
                keep.append((req, at))
        self.queue = keep
        return ended

    def _refuse(self, req: Req, why: str, status: int) -> Req:
        """A queued request (nothing allocated) ends; the prefill stops too."""
        req.finish({"type": "abort", "message": why})
        req.error, req.error_status = why, status
        self.transfers_failed += 1
        self.link.send(req.bootstrap.peer, PDCancel(req.bootstrap.room, why))
        self._unqueue(req)
        return req

    def _allocate(self, req: Req, n_running: int, adapter: str) -> bool:
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
        peer, room = _key(req)
        self.incoming[(peer, room)] = _Incoming(req, peer, p, self.clock(), received=p)
        self.prefix_hit_tokens += p
        self.link.send(peer, PDRegister(room, p, n, self.port.record_bytes, adapter))
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

    def _write_state(self, inc: _Incoming, msg: PDKVChunk) -> Optional[str]:
        """A piece of a hybrid model's recurrent state (in order; installed at PDDone)."""
        size = self.state_port.state_bytes if self.state_port is not None else 0
        if msg.start != len(inc.state) or len(inc.state) + len(msg.payload) > size:
            return (f"malformed state chunk for room {msg.room}: {len(msg.payload)} bytes at byte {msg.start} "
                    f"(expected byte {len(inc.state)} of a {size}-byte state)")
        inc.state += msg.payload
        return None

    def _done(self, inc: _Incoming, msg: PDDone) -> Optional[str]:
        req = inc.req
        if inc.received != len(req.input_ids):
            return f"room {msg.room}: the prefill finished after {inc.received} of {len(req.input_ids)} positions"
        if (why := self._done_problem(req, msg)) is not None:
            return f"room {msg.room}: the prefill's final message is malformed: {why}"
        if (why := self.adapters.mismatch(req.lora_id, msg.adapter, "prefill")) is not None:
            return f"room {msg.room}: {why}"
        if self.state_port is not None:  # a hybrid model decodes from the prefill's state, not from this match's
            if len(inc.state) != self.state_port.state_bytes:
                return (f"room {msg.room}: the prefill sent {len(inc.state)} of the recurrent state's "
                        f"{self.state_port.state_bytes} bytes")
            self.state_port.write_state(req.table_idx, bytes(inc.state))
            req.state_load = None
        del self.incoming[(inc.peer, msg.room)]
        self._left(inc.peer)
        self.link.send(inc.peer, PDAck(msg.room))
        self.transfers_done += 1
        req.cached_len = msg.cached_len
        if req.return_logprob:
            req.input_logprobs = list(msg.input_logprobs or [])
            req.input_top_logprobs = list(msg.input_top or [])
            req.input_ranks = list(msg.input_ranks or [])
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

    def _done_problem(self, req: Req, msg: PDDone) -> Optional[str]:
        """What in a PDDone does not fit its request (wire.py checked the types), or None."""
        n = len(req.input_ids)
        if (msg.first_token is None) != (req.sampling.max_new_tokens == 0):
            return f"first token {msg.first_token!r} for max_new_tokens {req.sampling.max_new_tokens}"
        if msg.first_token is not None and self.vocab_size is not None and msg.first_token >= self.vocab_size:
            return f"first token {msg.first_token} is outside the vocabulary (size {self.vocab_size})"
        if msg.cached_len > n:
            return f"cached_len {msg.cached_len} exceeds the prompt's {n} tokens"
        if req.return_logprob and any(v is not None and len(v) > n
                                      for v in (msg.input_logprobs, msg.input_top, msg.input_ranks)):
            return f"more input logprobs than the prompt's {n} tokens"
        return None

    def _fail(self, key: Key, why: str) -> Req:
        room = key[1]
        inc = self.incoming.pop(key)
        self._left(inc.peer)
        req = inc.req
        logger.warning("PD room %d (request %s) failed: %s", room, req.rid, why)
        self.kv.release(req, cache=False)  # half-received K/V never enters the radix cache
        self.link.send(inc.peer, PDCancel(room, why))
        req.finish({"type": "abort", "message": why})
        req.error, req.error_status = why, 503
        self.transfers_failed += 1
        return req

    # ------------------------------------------------------------------ peers
    def _use(self, peer: Any) -> None:
        self._users[peer] += 1
        self._idle.pop(peer, None)

    def _left(self, peer: Any) -> None:
        self._users[peer] -= 1
        if self._users[peer] <= 0:
            del self._users[peer]
            self._idle[peer] = self.clock()

    def _unqueue(self, req: Req) -> None:
        key = _key(req)
        self._queued.discard(key)
        self._left(key[0])

    def _close_idle_peers(self, now: float) -> None:
        """Sockets of peers no request uses: closed when the peer is dead, or idle for PEER_IDLE_S."""
        for peer, since in list(self._idle.items()):
            if self.link.silent_for(peer) > self.heartbeat_timeout or now - since > PEER_IDLE_S:
                del self._idle[peer]
                if hasattr(self.link, "forget"):
                    self.link.forget(peer)


def _key(req: Req) -> Key:
    host, port, room = req.bootstrap.host, req.bootstrap.port, req.bootstrap.room
    return (host, port), room

