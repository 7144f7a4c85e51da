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
from radixlang_runtime.logprob_format import input_meta, output_meta
from radixlang_runtime.messages import (AbortReq, BatchStrOut, ErrorOut, FlushCacheOut, FlushCacheReq, GetStatsReq,
                                        StatsOut, TokenizedGenerateReq, decode, encode)
from radixlang_runtime.sampling_params import SamplingParams
from radixlang_runtime.server.ipc import IpcPaths
from radixlang_runtime.server.metrics import ServerMetrics

logger = logging.getLogger(__name__)


class RuntimeUnavailable(RuntimeError):
    """The scheduler or detokenizer process is gone: HTTP 503."""


@dataclass
class LogprobRequest:
    """What a request asked for (normalize_logprob_args validated it)."""

    start: int = 0
    top_num: int = 0
    with_text: bool = False


@dataclass
class ReqState:
    rid: str
    input_ids: list[int]
    stream: bool
    logprob: Optional[LogprobRequest]
    queue: "asyncio.Queue[dict]" = field(default_factory=asyncio.Queue)
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    finished: bool = False
    created: float = field(default_factory=time.perf_counter)
    last_token_at: Optional[float] = None
    # logprobs received so far (non-streaming requests return them whole at the end)
    in_vals: list = field(default_factory=list)
    in_top: list = field(default_factory=list)
    out_vals: list = field(default_factory=list)
    out_top: list = field(default_factory=list)
    input_emitted: bool = False


class TokenizerManager:
    def __init__(self, ipc: IpcPaths, tokenizer: Any, limits: RuntimeLimits, metrics: Optional[ServerMetrics]):
        self.tokenizer = tokenizer
        self.limits = limits
        self.metrics = metrics
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
        state = ReqState(rid, input_ids, stream, logprob)
        self.states[rid] = state
        params = {k: v for k, v in vars(sp).items() if k != "n"}
        lp = logprob or LogprobRequest()
        await self.to_scheduler.send(encode(TokenizedGenerateReq(rid, list(input_ids), params, stream, logprob is not None,
                                                                 lp.start, lp.top_num)))
        try:
            while True:
                out = await state.queue.get()
                if "error" in out:
                    raise RuntimeUnavailable(out["error"]) if self.dead else RuntimeError(out["error"])
                yield out
                if out["meta_info"]["finish_reason"] is not None:
                    return
        finally:
            if not state.finished:  # the consumer went away: free the request's memory
                state.finished = True
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

    async def _control_call(self, cls: type, timeout: float = 30.0) -> Any:
        if self.dead:
            raise RuntimeUnavailable(self.dead)
        req_id = uuid.uuid4().hex
        fut = asyncio.get_running_loop().create_future()
        self._control[req_id] = fut
        try:
            await self.to_scheduler.send(encode(cls(req_id)))
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._control.pop(req_id, None)

    # ------------------------------------------------------------------ results
    async def _recv_loop(self) -> None:
        while True:
            msg = decode(await self.recv.recv())
            if isinstance(msg, BatchStrOut):
                self._on_batch(msg)
            elif isinstance(msg, (FlushCacheOut, StatsOut)):
                fut = self._control.get(msg.req_id)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            elif isinstance(msg, ErrorOut):
                for rid in msg.rids:
                    st = self.states.get(rid)
                    if st is not None:
                        st.finished = True
                        st.queue.put_nowait({"error": msg.message})

    def _on_batch(self, msg: BatchStrOut) -> None:
        now = time.perf_counter()
        for i, rid in enumerate(msg.rids):
            st = self.states.get(rid)
            if st is None:  # aborted by its handler meanwhile
                continue
            st.text = msg.texts[i] if msg.text_is_full[i] else st.text + msg.texts[i]
            new_ids = msg.new_ids[i]
            st.output_ids.extend(new_ids)
            fin = msg.finished_reasons[i]
            if self.metrics and new_ids:
                self.metrics.on_tokens(st.created, st.last_token_at, now, len(new_ids))
            if new_ids:
                st.last_token_at = now
            if fin is not None:
                st.finished = True
                if self.metrics:
                    self.metrics.on_finish(now - st.created, msg.queue_times[i], len(st.input_ids),
                                           msg.cached_tokens[i], fin.get("type") == "abort")
            meta = {
                "id": rid, "finish_reason": fin, "prompt_tokens": msg.prompt_tokens[i],
                "completion_tokens": msg.completion_tokens[i], "cached_tokens": msg.cached_tokens[i],
                "num_retractions": msg.num_retractions[i], "e2e_latency": now - st.created,
            }
            if st.logprob is not None and msg.output_logprobs:
                self._logprob_meta(st, msg, i, new_ids, meta)
            st.queue.put_nowait({"text": st.text, "output_ids": list(st.output_ids), "meta_info": meta})

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def _logprob_meta(self, st: ReqState, msg: BatchStrOut, i: int, new_ids: list[int], meta: dict) -> None:
        lp = st.logprob
        decode = self._token_text if lp.with_text else None
        if msg.input_logprobs[i] is not None:
            st.in_vals, st.in_top = msg.input_logprobs[i], msg.input_top_logprobs[i] or []
        out_vals, out_top = msg.output_logprobs[i] or [], msg.output_top_logprobs[i] or []
        if st.stream:
            if not st.input_emitted:
                meta.update(input_meta(st.input_ids, lp.start, st.in_vals, st.in_top, lp.top_num, decode))
                st.input_emitted = True
            meta.update(output_meta(out_vals, new_ids, out_top, lp.top_num, decode))
            meta["output_token_logprobs_length"] = len(st.output_ids)
        else:
            st.out_vals += out_vals
            st.out_top += out_top
            meta.update(input_meta(st.input_ids, lp.start, st.in_vals, st.in_top, lp.top_num, decode))
            meta.update(output_meta(st.out_vals, st.output_ids, st.out_top, lp.top_num, decode))

    def mark_dead(self, why: str) -> None:
        """A child process died: fail every waiting request now; new ones get 503."""
        self.dead = why
        for st in self.states.values():
            if not st.finished:
                st.finished = True
                st.queue.put_nowait({"error": why})
        for fut in self._control.values():
            if not fut.done():
                fut.set_exception(RuntimeUnavailable(why))
