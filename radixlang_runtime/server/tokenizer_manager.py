"""TokenizerManager: the server process's side of the runtime (asyncio, in the HTTP event loop).

It tokenizes and validates requests (the same checks as the in-process Engine, so bad input is a
ValueError -> HTTP 400 before the scheduler sees it), sends them to the scheduler, and routes the
detokenizer's results back to each waiting handler through a per-request asyncio.Queue. A handler
that stops listening (client gone) aborts its request, which frees its KV at the next step.
If a child process dies, `mark_dead` fails every request in flight and refuses new ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

import zmq
import zmq.asyncio

from radixlang_runtime.limits import RuntimeLimits, check_request
from radixlang_runtime.messages import (AbortReq, BatchStrOut, ErrorOut, FlushCacheOut, FlushCacheReq, GetStatsReq,
                                        PinPrefixOut, PinPrefixReq, StatsOut, TokenizedGenerateReq, UnpinPrefixOut,
                                        UnpinPrefixReq, decode, encode)
from radixlang_runtime.results import LogprobRequest, ResultBuilder
from radixlang_runtime.sampling_params import SamplingParams
from radixlang_runtime.server.ipc import IpcPaths
from radixlang_runtime.server.live_series import LiveSeries
from radixlang_runtime.server.metrics import ServerMetrics

logger = logging.getLogger(__name__)


class RuntimeUnavailable(RuntimeError):
    """The scheduler or detokenizer process is gone: HTTP 503."""


@dataclass
class ReqState:
    result: ResultBuilder
    queue: "asyncio.Queue[dict]" = field(default_factory=asyncio.Queue)

    @property
    def finished(self) -> bool:
        return self.result.finished


class TokenizerManager:
    def __init__(self, ipc: IpcPaths, tokenizer: Any, limits: RuntimeLimits, metrics: Optional[ServerMetrics]):
        self.tokenizer = tokenizer
        self.limits = limits
        self.metrics = metrics
        self.live = LiveSeries()  # the dashboard's recent history (always on: a few deque appends)
        ctx = zmq.asyncio.Context()
        self.to_scheduler = ctx.socket(zmq.PUSH)
        self.to_scheduler.connect(ipc.scheduler_in)
        self.recv = ctx.socket(zmq.PULL)
        self.recv.bind(ipc.tokenizer_in)
        self.states: dict[str, ReqState] = {}
        self._control: dict[str, asyncio.Future] = {}
        self.dead: Optional[str] = None
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._recv_loop())

    # ------------------------------------------------------------------ requests
    def encode_text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prepare(self, input_ids: list[int], sampling_params: Optional[dict]) -> SamplingParams:
        """Validate one prompt; raises ValueError naming the problem."""
        if not isinstance(sampling_params, (dict, type(None))):
            raise ValueError("sampling_params must be an object")
        sp = SamplingParams.from_dict(sampling_params)
        check_request(input_ids, sp, self.limits)
        return sp

    async def generate(self, input_ids: list[int], sp: SamplingParams, rid: Optional[str] = None,
                       stream: bool = False, logprob: Optional[LogprobRequest] = None) -> AsyncIterator[dict]:
        """Yields progress snapshots ({"text", "output_ids", "meta_info"}); the last has a finish_reason.
        Exactly one sample (callers fan out n > 1 with distinct rids). Text and output_ids are
        cumulative; with logprobs, a streaming request's output logprob lists are the delta since the
        previous snapshot (input ones come once, in the first), a non-streaming one gets them whole."""
        if self.dead:
            raise RuntimeUnavailable(self.dead)
        rid = rid or uuid.uuid4().hex
        if rid in self.states:
            raise ValueError(f"request id {rid!r} is already in use")
        state = ReqState(ResultBuilder(rid, input_ids, stream, logprob, self._token_text))
        self.states[rid] = state
        params = sp.to_wire()
        lp = logprob or LogprobRequest()
        await self.to_scheduler.send(encode(TokenizedGenerateReq(rid, list(input_ids), params, stream, logprob is not None,
                                                                 lp.start, lp.top_num)))
        try:
            while True:
                out = await state.queue.get()
                if "error" in out:
                    if self.dead:
                        raise RuntimeUnavailable(out["error"])
                    raise (ValueError if out.get("status") == 400 else RuntimeError)(out["error"])
                yield out
                if out["meta_info"]["finish_reason"] is not None:
                    return
        finally:
            if not state.finished:  # the consumer went away: free the request's memory
                state.result.finished = True
                self.abort(rid)
                if self.metrics:
                    self.metrics.on_abandoned()
            self.states.pop(rid, None)

    def abort(self, rid: str) -> None:
        """Queue an abort (no await: this also runs while a cancelled handler unwinds)."""
        self.to_scheduler.send(encode(AbortReq(rid)))

    async def flush_cache(self) -> bool:
        return (await self._control_call(FlushCacheReq)).success

    async def get_stats(self) -> dict[str, Any]:
        return (await self._control_call(GetStatsReq)).stats

    async def get_dashboard_stats(self, with_ids: bool) -> dict[str, Any]:
        """get_stats plus the live view's state ("dashboard": queues, KV split, radix tree summary)."""
        return (await self._control_call(GetStatsReq, "dashboard", with_ids)).stats

    async def pin_prefix(self, input_ids: list[int], ttl_s: Optional[float] = None) -> dict[str, Any]:
        """Lock the cached part of input_ids in the radix cache (KVManager.pin: only what is cached;
        prefill it first). Returns {"pin_id", "pinned_len", "input_len"}; a bad ttl_s is a ValueError."""
        out = await self._control_call(PinPrefixReq, list(input_ids), ttl_s)
        if out.pin_id is None:
            raise ValueError(out.error or "the prefix could not be pinned")
        return {"pin_id": out.pin_id, "pinned_len": out.pinned_len, "input_len": len(input_ids)}

    async def unpin_prefix(self, pin_id: str) -> bool:
        """Release a pin; False when there is none by that id (unknown, unpinned or expired)."""
        return (await self._control_call(UnpinPrefixReq, pin_id)).success

    async def _control_call(self, cls: type, *fields: Any, timeout: float = 30.0) -> Any:
        if self.dead:
            raise RuntimeUnavailable(self.dead)
        req_id = uuid.uuid4().hex
        fut = asyncio.get_running_loop().create_future()
        self._control[req_id] = fut
        try:
            await self.to_scheduler.send(encode(cls(req_id, *fields)))
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._control.pop(req_id, None)

    # ------------------------------------------------------------------ results
    async def _recv_loop(self) -> None:
        while True:
            msg = decode(await self.recv.recv())
            if isinstance(msg, BatchStrOut):
                self._on_batch(msg)
            elif isinstance(msg, (FlushCacheOut, StatsOut, PinPrefixOut, UnpinPrefixOut)):
                fut = self._control.get(msg.req_id)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            elif isinstance(msg, ErrorOut):
                for rid in msg.rids:
                    st = self.states.get(rid)
                    if st is not None:
                        st.result.finished = True
                        st.queue.put_nowait({"error": msg.message, "status": msg.status})

    def _on_batch(self, msg: BatchStrOut) -> None:
        now = time.perf_counter()
        for i, rid in enumerate(msg.rids):
            st = self.states.get(rid)
            if st is None:  # aborted by its handler meanwhile
                continue
            res = st.result
            last = res.last_token_at
            snapshot = res.apply(msg, i, now)
            new_ids = msg.new_ids[i]
            fin = msg.finished_reasons[i]
            if new_ids:
                self.live.on_tokens(res.created, last, now, len(new_ids))
            if fin is not None:
                self.live.on_finish()
            if self.metrics and new_ids:
                self.metrics.on_tokens(res.created, last, now, len(new_ids))
            if fin is not None and self.metrics:
                self.metrics.on_finish(now - res.created, msg.queue_times[i], len(res.input_ids),
                                       msg.cached_tokens[i], fin.get("type") == "abort")
            st.queue.put_nowait(snapshot)

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def mark_dead(self, why: str) -> None:
        """A child process died: fail every waiting request now; new ones get 503."""
        self.dead = why
        for st in self.states.values():
            if not st.finished:
                st.result.finished = True
                st.queue.put_nowait({"error": why})
        for fut in self._control.values():
            if not fut.done():
                fut.set_exception(RuntimeUnavailable(why))
