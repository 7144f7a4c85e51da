"""PrefillRole (torch-free): the prefill server's side of a PD transfer, hooked into the Scheduler.

A request (its `bootstrap`: host, port, room) is prefilled as usual. Decode servers register rooms on
the bootstrap socket (PDRegister: the decode's cached prefix length, the prompt length); a registration may
come before or after its request. While chunked prefill runs, each finished chunk's K/V past the decode's
prefix goes out at once (`on_chunk`); when the first token is sampled the Scheduler hands the request over
(`hold`, its KV still held), the rest of its K/V goes out, then PDDone (first token + logprobs). The decode's
PDAck ends the request: it finishes ("length" after its first token, or what its stop check said), its KV
goes into the radix cache, and its answer (that one token) leaves through the loop as usual.

Strangers (docs/DISAGGREGATION.md, "Security"): a second request with a room in flight here is refused with
400 naming the room (`add`, before it is queued: nothing allocated); a room's first registration holds it
(a registration of the same room from another decode is dropped and counted), and only the registered
decode's PDAck / PDCancel count. A link whose thread stays down raises FatalFault here.

Faults, each bounded: no registration within transfer_timeout, the registered decode silent for longer than
heartbeat_timeout, no ack within transfer_timeout, a PDCancel: the request ends with a 503 error naming
the cause (and the decode gets PDFail). The K/V is read through `port.read_joined` (mem/kv_records.py with
one-token records), so positions need not be page-aligned and the two servers' page sizes may differ. A hybrid
model's request also sends its recurrent state after the prompt (`state_port`, mem/state_records.py) as chunks
flagged `state`, after its K/V and before PDDone.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from radixlang_runtime.disagg.adapters import PDAdapters
from radixlang_runtime.disagg.link import dropped_stats
from radixlang_runtime.utils.faults import FatalFault
from radixlang_runtime.protocol.messages import PDAck, PDCancel, PDDone, PDFail, PDKVChunk, PDRegister
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.scheduler.request import Req

logger = logging.getLogger(__name__)
CHUNK_BYTES = 1 << 20  # K/V bytes per PDKVChunk message (at least one token)


@dataclass
class _Registration:
    peer: Any  # the decode's routing id on the bootstrap socket
    prefix_len: int  # positions the decode has already (its radix cache): never sent
    total_len: int  # the prompt length the decode expects
    token_bytes: int
    at: float
    adapter: str = ""  # the decode's identity of the request's LoRA adapter ("" the base)


@dataclass
class _Held:
    req: Req
    since: float  # when the first token was sampled (the bound on waiting for a registration / the ack)
    sent_done: bool = False  # every chunk and PDDone are queued
    acked: bool = False  # the decode's PDAck came


class PrefillRole:
    kind = "prefill"

    def __init__(self, link: Any, port: Any, kv: KVManager, transfer_timeout: float, heartbeat_timeout: float,
                 clock: Callable[[], float] = time.monotonic, adapters: Optional[PDAdapters] = None):
        self.link, self.port, self.kv = link, port, kv
        self.adapters = adapters or PDAdapters(lambda i: None, lambda i: None)  # LoRA identities (adapters.py)
        self.transfer_timeout, self.heartbeat_timeout, self.clock = transfer_timeout, heartbeat_timeout, clock
        self.regs: dict[int, _Registration] = {}  # room -> registration
        self.sent: dict[int, int] = {}  # room -> positions sent so far (from the decode's prefix on)
        self.cancelled: dict[int, tuple[str, float]] = {}  # room -> (why, when), for requests not held yet
        self.held: dict[int, _Held] = {}  # room -> a request past its first token
        self.rooms: dict[int, Req] = {}  # room -> its request here, from add until it finishes
        self._refused: list[Req] = []  # duplicates refused by add(), returned by the next poll
        self._purged_at = clock()
        self.dropped: Counter = Counter()  # messages the role dropped, by reason
        self.transferred_tokens = 0
        self.transfers_done = 0
        self.transfers_failed = 0
        self.state_port: Any = None  # hybrid models: the state pool's (mem/state_records.py); sent after the K/V

    # ------------------------------------------------------------------ scheduler hooks
    @property
    def pending(self) -> bool:
        return bool(self.held)

    def held_reqs(self) -> list[Req]:
        return [h.req for h in self.held.values()]

    def add(self, req: Req) -> bool:
        """A new request: True (the scheduler queues it for prefill as usual), or False when its room is in
        flight here (refused with 400, returned ended by the next poll)."""
        room = req.bootstrap.room
        other = self.rooms.get(room)
        if other is not None and not other.finished:
            why = f"bootstrap_room {room} is already in flight on this prefill server (rooms must be unique)"
            req.finish({"type": "abort", "message": why})
            req.error, req.error_status = why, 400
            self._refused.append(req)
            return False
        self.rooms[room] = req
        return True

    def on_chunk(self, req: Req) -> None:
        """A non-final chunk ran: send the K/V computed so far when the decode has registered."""
        room = req.bootstrap.room
        reg = self.regs.get(room)
        if reg is not None and self._check_reg(req, reg) is None:
            self._send_kv(req, room, reg, req.kv_len)

    def hold(self, req: Req) -> None:
        """The first token is sampled (or max_new_tokens is 0): finish the transfer, then the request."""
        self.held[req.bootstrap.room] = _Held(req, self.clock())

    def poll(self, n_running: int = 0) -> tuple[list[Req], list[Req]]:
        """Messages from decodes, then each held request's next move. Returns (ended requests, [])."""
        if (problem := getattr(self.link, "problem", None)) is not None:
            raise FatalFault(problem)
        for peer, msg in self.link.receive():
            reg = self.regs.get(msg.room)
            if reg is not None and reg.peer != peer:  # the room is another decode's
                self.dropped["unmatched"] += 1
            elif isinstance(msg, PDRegister):
                if reg is None:
                    self.regs[msg.room] = _Registration(peer, msg.prefix_len, msg.total_len, msg.token_bytes,
                                                        self.clock(), msg.adapter)
                else:
                    self.dropped["duplicate_registration"] += 1
            elif isinstance(msg, PDAck):
                h = self.held.get(msg.room)
                if h is not None and h.sent_done and reg is not None:
                    h.acked = True
                else:
                    self.dropped["unmatched"] += 1
            elif isinstance(msg, PDCancel):
                self.regs.pop(msg.room, None)
                why = msg.message[:500] or "cancelled by the decode server"
                self.cancelled[msg.room] = (why, self.clock())
            else:
                self.dropped["unmatched"] += 1
        ended = [req for room, h in list(self.held.items()) if (req := self._advance(room, h)) is not None]
        self._expire()
        ended, self._refused = self._refused + ended, []
        return ended, []

    def take(self, rids: Iterable[str], failed: bool = False) -> list[Req]:
        """Aborts / failed batches: the held requests named leave (released; the decode gets PDFail)."""
        rids = set(rids)
        out = []
        for room, h in list(self.held.items()):
            if h.req.rid in rids:
                self._drop(room, "aborted on the prefill server", cache=not failed)
                out.append(h.req)
        return out

    def take_all(self) -> list[Req]:
        return self.take([h.req.rid for h in self.held.values()], failed=True)

    def stats(self) -> dict[str, Any]:
        return {"mode": "prefill", "transferred_tokens": self.transferred_tokens, "transfers_done": self.transfers_done,
                "transfers_failed": self.transfers_failed, "held": len(self.held), "registrations": len(self.regs),
                **dropped_stats(self.link, self.dropped)}

    # ------------------------------------------------------------------ internals
    def _advance(self, room: int, h: _Held) -> Optional[Req]:
        req, now = h.req, self.clock()
        if h.acked:
            return self._finish(room, h)
        reg = self.regs.get(room)
        why = None
        if room in self.cancelled:
            why = self.cancelled.pop(room)[0]
        elif reg is None:
            if now - h.since > self.transfer_timeout:
                why = f"no decode server registered room {room} within {self.transfer_timeout:g} s"
        elif self.link.silent_for(reg.peer) > self.heartbeat_timeout:
            why = f"the decode server of room {room} is unreachable (no heartbeat for {self.heartbeat_timeout:g} s)"
        elif h.sent_done and now - h.since > self.transfer_timeout:
            why = f"the decode server did not acknowledge room {room} within {self.transfer_timeout:g} s"
        elif not h.sent_done:
            why = self._check_reg(req, reg)
            if why is None:
                self._send_kv(req, room, reg, len(req.input_ids))
                self._send_state(req, room, reg)
                lp = req.return_logprob
                self.link.send(reg.peer, PDDone(
                    room, req.output_ids[0] if req.output_ids else None, req.cached_len,
                    req.output_logprobs[0] if lp and req.output_logprobs else None,
                    req.output_top_logprobs[0] if lp and req.output_top_logprobs else None,
                    req.input_logprobs if lp else None, req.input_top_logprobs if lp else None,
                    self.adapters.identity(req.lora_id) or "", req.input_ranks if lp else None))
                h.sent_done, h.since = True, now  # the ack's bound starts now
        if why is None:
            return None
        logger.warning("PD room %d (request %s) failed: %s", room, req.rid, why)
        self._drop(room, why, cache=True)
        req.finish({"type": "abort", "message": why})
        req.error, req.error_status = why, 503
        return req

    def _check_reg(self, req: Req, reg: _Registration) -> Optional[str]:
        if reg.total_len != len(req.input_ids) or not 0 <= reg.prefix_len <= reg.total_len:
            return (f"the decode server registered room {req.bootstrap.room} for {reg.total_len} prompt tokens "
                    f"(prefix {reg.prefix_len}); this prompt has {len(req.input_ids)}: different bodies?")
        if reg.token_bytes != self.port.record_bytes:
            return (f"KV layouts differ: the decode stores {reg.token_bytes} bytes a token, this prefill "
                    f"{self.port.record_bytes} (the same model and dtype are needed on both; tp sizes may differ)")
        return self.adapters.mismatch(req.lora_id, reg.adapter, "decode")

    def _send_kv(self, req: Req, room: int, reg: _Registration, upto: int) -> None:
        """K/V of positions [max(sent, decode prefix), upto) to the decode, in CHUNK_BYTES messages."""
        start = max(self.sent.get(room, 0), reg.prefix_len)
        per = max(1, CHUNK_BYTES // self.port.record_bytes)
        for p in range(start, upto, per):
            q = min(p + per, upto)
            payload = self.port.read_joined(req.kv_indices[p:q])
            self.link.send(reg.peer, PDKVChunk(room, p, payload))
            self.transferred_tokens += q - p
        self.sent[room] = max(start, upto)

    def _send_state(self, req: Req, room: int, reg: _Registration) -> None:
        """A hybrid model: the request's recurrent state after its prompt (its state slot is its table row,
        untouched while it is held), in CHUNK_BYTES messages flagged state, after its K/V."""
        if self.state_port is None:
            return
        payload = self.state_port.read_state(req.table_idx)
        for off in range(0, len(payload), CHUNK_BYTES):
            self.link.send(reg.peer, PDKVChunk(room, off, payload[off:off + CHUNK_BYTES], state=True))

    def _finish(self, room: int, h: _Held) -> Req:
        req = h.req
        if not req.finished:
            req.finish({"type": "length", "length": len(req.output_ids)})
        self.held.pop(room)
        self.regs.pop(room, None)
        self.sent.pop(room, None)
        self.kv.release(req, cache=True)
        self.transfers_done += 1
        return req

    def _drop(self, room: int, why: str, cache: bool) -> None:
        h = self.held.pop(room)
        reg = self.regs.pop(room, None)
        self.sent.pop(room, None)
        if reg is not None:
            self.link.send(reg.peer, PDFail(room, why))
        self.kv.release(h.req, cache=cache)
        self.transfers_failed += 1

    def _expire(self) -> None:
        """Registrations and cancellations whose request never came are forgotten after transfer_timeout."""
        now = self.clock()
        for room in [r for r, g in self.regs.items() if r not in self.held and now - g.at > self.transfer_timeout]:
            del self.regs[room]
            self.sent.pop(room, None)
        for room in [r for r, (_, at) in self.cancelled.items() if now - at > self.transfer_timeout]:
            del self.cancelled[room]
        if now - self._purged_at > 1.0:  # finished requests leave the room map (however they ended)
            self._purged_at = now
            self.rooms = {r: q for r, q in self.rooms.items() if not q.finished}
