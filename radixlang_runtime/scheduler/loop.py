"""RequestLoop: the one drain -> step -> emit cycle, shared by the in-process Engine and the server.

The loop owns what is common: turning `TokenizedGenerateReq` messages into scheduler requests,
aborts, control calls (flush, stats, prefix pins, an arbitrary function on the scheduler thread), one scheduler
step at a time, and the progress messages of the requests a step touched (`BatchTokenIDOut`, the
same typed message the server sends to its detokenizer). What differs is only where messages come
from and go to, a `LoopIO`: Python queues in the Engine (loop_thread.py), ZeroMQ sockets in the
server's scheduler process (server/scheduler_process.py).

Invariants:
- a request's progress goes out at its finish and, when streaming, every stream_interval tokens
  (`update_due`) as one ReqTokenOut record in a BatchTokenIDOut; output ids and output logprobs go out
  as deltas, the request's constants (ReqConsts) and input logprobs once, in its first record.
- every request that entered the loop gets exactly one final message: a finish in a BatchTokenIDOut,
  or an error (`LoopIO.send_error`) when a fault ended it. A step fault ends only its batch's
  requests (Scheduler.step); a fault outside any batch ends every request in flight.
- the loop never blocks while the scheduler has work; idle, it waits at most `idle_wait` seconds.
- a FatalFault (a tensor-parallel peer gone) fails every request in flight, then `run` re-raises it:
  the process cannot serve any more.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from radixlang_runtime.utils.faults import FatalFault
from radixlang_runtime.protocol.messages import (AbortReq, BatchTokenIDOut, FlushCacheOut, FlushCacheReq, GetStatsReq,
                                        PinPrefixOut, PinPrefixReq, ReqConsts, ReqProgress, ReqTokenOut, StatsOut,
                                        TokenizedBatchReq, TokenizedGenerateReq, UnpinPrefixOut, UnpinPrefixReq,
                                        LoadLoraOut, LoadLoraReq, UnloadLoraOut, UnloadLoraReq, GetWeightsOut,
                                        GetWeightsReq, UpdateWeightsOut, UpdateWeightsReq)
from radixlang_runtime.pooling import PooledSum
from radixlang_runtime.scheduler.hidden_states import hidden_states_out
from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


@dataclass
class Call:
    """Run fn(scheduler) between two steps (in-process only); reply(ok, value or exception)."""

    fn: Callable[[Scheduler], Any]
    reply: Callable[[bool, Any], None]


class LoopIO(Protocol):
    def receive(self, timeout: float) -> list[Any]:
        """Messages that arrived; waits up to `timeout` seconds for the first (0: never waits)."""

    def send_tokens(self, out: BatchTokenIDOut) -> None: ...

    def send_error(self, rids: list[str], message: str, status: int = 500) -> None: ...

    def send_control(self, msg: Any) -> None:
        """A reply to a control request (FlushCacheOut, StatsOut)."""


def update_due(req: Req, sent_len: int, stream: bool, stream_interval: int) -> bool:
    """Whether a request's progress goes out now: at the finish, and for a streaming request every
    stream_interval new tokens."""
    return req.finished or (stream and len(req.output_ids) - sent_len >= stream_interval)


@dataclass
class _Sent:
    stream: bool
    sent_len: int = 0  # output tokens (and output logprobs) already sent
    first: bool = True  # no record sent yet: the next one carries the request's constants


class RequestLoop:
    def __init__(self, scheduler: Scheduler, io: LoopIO, stream_interval: int = 1,
                 stats: Optional[Callable[[Scheduler], dict]] = None, idle_wait: float = 0.5):
        self.scheduler = scheduler
        self.io = io
        self.stream_interval = stream_interval
        self.stats = stats
        self.idle_wait = idle_wait
        self.sent: dict[str, _Sent] = {}
        self._dashboard: Any = None  # DashboardState, made at the first dashboard stats request
        # tensor parallel: rank 0 keeps its group alive between steps (model/executor/parallel.py); fakes have none
        self._keepalive: Optional[Callable[[], None]] = getattr(scheduler.runner, "keepalive", None)

    def run(self, should_stop: Callable[[], bool]) -> None:
        while not should_stop():
            self.run_once()

    def run_once(self) -> None:
        try:
            self._iterate()
        except FatalFault as e:
            logger.error("fatal: %s; failing every request in flight", e)
            self.emit(e.touched + self.scheduler.abort_all(f"internal error: {e}"))
            raise

    def _iterate(self) -> None:
        for msg in self.io.receive(self.idle_wait if self.scheduler.is_idle else 0.0):
            self.handle(msg)
        for pin_id in self.scheduler.kv.expire_pins():  # every iteration, idle ones too (idle_wait apart)
            logger.info("prefix pin %s expired", pin_id)
        if self._keepalive is not None:
            self._keepalive()
        if self.scheduler.is_idle:
            return
        if self.scheduler.only_background_pending:  # compiles / PD transfers run elsewhere: don't spin
            for msg in self.io.receive(0.005):
                self.handle(msg)
        try:
            touched = self.scheduler.step()
        except FatalFault:
            raise
        except Exception as e:  # noqa: BLE001 - a fault outside any batch: fail what is in flight, keep serving
            logger.exception("scheduler step failed outside a batch")
            touched = self.scheduler.abort_all(f"internal error: {type(e).__name__}: {e}")
        self.emit(touched)

    # ------------------------------------------------------------------ intake
    def handle(self, msg: Any) -> None:
        if isinstance(msg, TokenizedBatchReq):  # several requests drained at once: one prefill batch where they fit
            for req in msg.reqs:
                self.handle(req)
        elif isinstance(msg, TokenizedGenerateReq):
            loras = getattr(self.scheduler.runner, "loras", None)
            if msg.lora_id and (loras is None or msg.lora_id not in loras):  # unloaded meanwhile
                self.io.send_error([msg.rid], f"LoRA adapter id {msg.lora_id} is not loaded (unloaded)", 400)
                return
            self.sent[msg.rid] = _Sent(stream=msg.stream)
            self.scheduler.add_request(Req(
                rid=msg.rid, input_ids=msg.input_ids, sampling=msg.sampling_params, return_logprob=msg.return_logprob,
                logprob_start_len=msg.logprob_start_len, top_logprobs_num=msg.top_logprobs_num,
                bootstrap=msg.bootstrap, pooled=PooledSum(msg.pooling) if msg.pooling else None, lora_id=msg.lora_id,
                priority=msg.priority, cache_salt=msg.cache_salt, return_hidden_states=msg.return_hidden_states,
                images=msg.images))
        elif isinstance(msg, AbortReq):
            self.scheduler.abort(msg.rid)
        elif isinstance(msg, FlushCacheReq):
            self.io.send_control(FlushCacheOut(msg.req_id, self.scheduler.flush_cache(msg.tiers)))
        elif isinstance(msg, GetStatsReq):
            stats = self.stats(self.scheduler) if self.stats else {}
            if msg.detail == "dashboard":
                if self._dashboard is None:
                    from radixlang_runtime.scheduler.dashboard_state import DashboardState

                    self._dashboard = DashboardState()
                stats = {**stats, "dashboard": self._dashboard.collect(self.scheduler, msg.with_ids)}
            self.io.send_control(StatsOut(msg.req_id, stats))
        elif isinstance(msg, PinPrefixReq):
            try:
                pin_id, pinned_len = self.scheduler.kv.pin(msg.input_ids, msg.ttl_s, owner=msg.owner)
            except ValueError as e:  # validated by the sender; a bad one is answered, never fatal
                self.io.send_control(PinPrefixOut(msg.req_id, None, 0, str(e)))
            else:
                self.io.send_control(PinPrefixOut(msg.req_id, pin_id, pinned_len))
        elif isinstance(msg, LoadLoraReq):
            try:
                self.io.send_control(LoadLoraOut(msg.req_id, self.scheduler.load_lora(msg.lora_name, msg.lora_path)))
            except (ValueError, OSError) as e:  # a bad adapter is answered, never fatal
                self.io.send_control(LoadLoraOut(msg.req_id, 0, str(e)))
        elif isinstance(msg, UnloadLoraReq):
            self.io.send_control(UnloadLoraOut(msg.req_id, self.scheduler.drop_lora_if_unused(msg.lora_id)))
        elif isinstance(msg, UpdateWeightsReq):
            from radixlang_runtime.model.executor.weight_update import update_from_disk
            from radixlang_runtime.scheduler.weight_sync import apply_weight_update

            ok, message = apply_weight_update(
                self.scheduler, lambda r: update_from_disk(r, msg.model_path, msg.load_format), msg.model_path)
            self.io.send_control(UpdateWeightsOut(msg.req_id, ok, message))
        elif isinstance(msg, GetWeightsReq):
            from radixlang_runtime.model.executor.weight_read import weights_by_name

            try:
                self.io.send_control(GetWeightsOut(msg.req_id, weights_by_name(self.scheduler.runner, msg.name,
                                                                               msg.truncate_size)))
            except ValueError as e:  # an unknown name or an unreadable layout is answered, never fatal
                self.io.send_control(GetWeightsOut(msg.req_id, None, str(e)))
            except Exception as e:  # noqa: BLE001 - a layout the reader does not know: answered, never fatal
                logger.exception("get_weights_by_name %r failed", msg.name)
                self.io.send_control(GetWeightsOut(msg.req_id, None, f"{type(e).__name__}: {e}"))
        elif isinstance(msg, UnpinPrefixReq):
            self.io.send_control(UnpinPrefixOut(msg.req_id, self.scheduler.kv.unpin(msg.pin_id, msg.owner)))
        elif isinstance(msg, Call):
            try:
                value = msg.fn(self.scheduler)
            except Exception as e:  # noqa: BLE001 - handed to the caller
                msg.reply(False, e)
            else:
                msg.reply(True, value)
        else:
            logger.warning("scheduler loop: unexpected message %s", type(msg).__name__)

    # ------------------------------------------------------------------ progress
    def emit(self, touched: list[Req]) -> None:
        out = BatchTokenIDOut()
        errors: dict[tuple[str, int], list[str]] = {}
        for req in touched:
            st = self.sent.get(req.rid)
            if st is None:
                continue
            if req.error is not None:
                errors.setdefault((req.error, req.error_status), []).append(req.rid)
                del self.sent[req.rid]
                continue
            if not update_due(req, st.sent_len, st.stream, self.stream_interval):
                continue
            out.reqs.append(token_record(req, st.sent_len, st.first))
            st.sent_len, st.first = len(req.output_ids), False
            if req.finished:
                del self.sent[req.rid]
        for (message, status), rids in errors.items():
            self.io.send_error(rids, message, status)
        if out.reqs:
            self.io.send_tokens(out)


def token_record(req: Req, sent_len: int, first: bool) -> ReqTokenOut:
    """req's progress since sent_len output tokens; first: also its constants (the first record sent)."""
    n = len(req.output_ids)
    lp = req.return_logprob
    top = lp and req.top_logprobs_num > 0
    progress = ReqProgress(
        new_ids=req.output_ids[sent_len:n], finished_reason=req.finished_reason, completion_tokens=n,
        cached_tokens=req.cached_len, num_retractions=req.num_retractions,
        queue_time=req.admitted_at - req.created_at if req.admitted_at else 0.0,
        forced_tokens=req.forced_tokens, forward_passes=req.forward_passes,
        spec_draft_tokens=req.spec_draft_tokens, spec_accepted_tokens=req.spec_accepted_tokens,
        input_logprobs=req.input_logprobs if lp and first else None,
        input_top_logprobs=req.input_top_logprobs if top and first else None,
        output_logprobs=req.output_logprobs[sent_len:n] if lp else None,
        output_top_logprobs=req.output_top_logprobs[sent_len:n] if top else None,
        embedding=req.pooled.result() if req.pooled is not None and req.finished else None,
        input_ranks=req.input_ranks if lp and first else None,
        hidden_states=hidden_states_out(req) if req.finished else None)
    sp = req.sampling
    consts = ReqConsts(skip_special_tokens=sp.skip_special_tokens,
                       spaces_between_special_tokens=sp.spaces_between_special_tokens,
                       no_stop_trim=sp.no_stop_trim) if first else None
    return ReqTokenOut(rid=req.rid, progress=progress, stop_from_end=req.stop_from_end, consts=consts)
