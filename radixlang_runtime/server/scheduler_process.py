"""The scheduler process: owns the model and the KV cache, steps the Scheduler, talks ZeroMQ.

Loop: drain the inbox (blocking briefly only when idle) -> one scheduler step -> send the new tokens
of the touched requests to the detokenizer. Streaming requests are sent every `stream_interval`
tokens, others once, when they finish. Control requests (flush, stats) are answered directly to the
tokenizer manager. A failing step finishes every request in flight with an ErrorOut (never a hang);
the process exits when its parent disappears.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import zmq

from radixlang_runtime.messages import (AbortReq, BatchTokenIDOut, ErrorOut, FlushCacheOut, FlushCacheReq,
                                        GetStatsReq, StatsOut, TokenizedGenerateReq, decode, encode)
from radixlang_runtime.scheduler.loop import update_due
from radixlang_runtime.server.ipc import IpcPaths
from radixlang_runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)


@dataclass
class _Sent:
    stream: bool
    sent_len: int = 0  # output tokens (and output logprobs) already sent


class SchedulerProcessLoop:
    def __init__(self, scheduler: Any, ipc: IpcPaths, stream_interval: int):
        from radixlang_runtime.sampling_params import SamplingParams
        from radixlang_runtime.scheduler.request import Req

        self._Req, self._SP = Req, SamplingParams
        self.scheduler = scheduler
        self.stream_interval = stream_interval
        ctx = zmq.Context()
        self.recv = ctx.socket(zmq.PULL)
        self.recv.bind(ipc.scheduler_in)
        self.to_detok = ctx.socket(zmq.PUSH)
        self.to_detok.connect(ipc.detokenizer_in)
        self.to_tokenizer = ctx.socket(zmq.PUSH)
        self.to_tokenizer.connect(ipc.tokenizer_in)
        self.sent: dict[str, _Sent] = {}
        self.parent = os.getppid()

    def run(self) -> None:
        while True:
            idle = self.scheduler.is_idle
            if idle:
                if os.getppid() != self.parent:
                    logger.info("parent process gone: scheduler exits")
                    return
                if not self.recv.poll(timeout=500):
                    continue
            self._drain()
            try:
                touched = self.scheduler.step()
            except Exception as e:  # fail what was in flight, keep serving
                logger.exception("scheduler step failed")
                reqs = self.scheduler.abort_all(f"internal error: {e!r}")
                for r in reqs:
                    self.sent.pop(r.rid, None)
                if reqs:
                    self.to_tokenizer.send(encode(ErrorOut([r.rid for r in reqs], f"internal error: {e!r}")))
                continue
            self._emit(touched)

    def _drain(self) -> None:
        while True:
            try:
                data = self.recv.recv(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(decode(data))

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, TokenizedGenerateReq):
            sp = self._SP.from_dict(msg.sampling_params)  # validated by the sender; cannot fail here
            self.sent[msg.rid] = _Sent(stream=msg.stream)
            self.scheduler.add_request(self._Req(
                rid=msg.rid, input_ids=msg.input_ids, sampling=sp, return_logprob=msg.return_logprob,
                logprob_start_len=msg.logprob_start_len, top_logprobs_num=msg.top_logprobs_num))
        elif isinstance(msg, AbortReq):
            self.scheduler.abort(msg.rid)
        elif isinstance(msg, FlushCacheReq):
            self.to_tokenizer.send(encode(FlushCacheOut(msg.req_id, self.scheduler.flush_cache())))
        elif isinstance(msg, GetStatsReq):
            from radixlang_runtime.scheduler.factory import scheduler_stats

            self.to_tokenizer.send(encode(StatsOut(msg.req_id, scheduler_stats(self.scheduler))))
        else:
            logger.warning("scheduler: unexpected message %s", type(msg).__name__)

    def _emit(self, touched: list) -> None:
        out = BatchTokenIDOut([], [], [], [], [], [], [], [], [], [], [])
        for req in touched:
            st = self.sent.get(req.rid)
            if st is None:
                continue
            if not update_due(req, st.sent_len, st.stream, self.stream_interval):
                continue
            n = len(req.output_ids)
            sp = req.sampling
            out.rids.append(req.rid)
            out.new_ids.append(req.output_ids[st.sent_len:n])
            out.finished_reasons.append(req.finished_reason)
            out.prompt_tokens.append(len(req.input_ids))
            out.completion_tokens.append(n)
            out.cached_tokens.append(req.cached_len)
            out.num_retractions.append(req.num_retractions)
            out.queue_times.append(req.admitted_at - req.created_at if req.admitted_at else 0.0)
            out.skip_special_tokens.append(sp.skip_special_tokens)
            out.spaces_between_special_tokens.append(sp.spaces_between_special_tokens)
            out.no_stop_trim.append(sp.no_stop_trim)
            lp, first = req.return_logprob, st.sent_len == 0
            top = lp and req.top_logprobs_num > 0
            out.input_logprobs.append(req.input_logprobs if lp and first else None)
            out.input_top_logprobs.append(req.input_top_logprobs if top and first else None)
            out.output_logprobs.append(req.output_logprobs[st.sent_len:n] if lp else None)
            out.output_top_logprobs.append(req.output_top_logprobs[st.sent_len:n] if top else None)
            st.sent_len = n
            if req.finished:
                del self.sent[req.rid]
        if out.rids:
            self.to_detok.send(encode(out))


def run_scheduler_process(args: ServerArgs, ipc: IpcPaths, ready: Connection) -> None:
    """Entry point of the child process. Reports {"status": "ready", ...} or {"status": "error", ...}."""
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s scheduler %(levelname)s %(message)s")
    try:
        from transformers import AutoTokenizer

        from radixlang_runtime.model.resolve import resolve_model_dir
        from radixlang_runtime.scheduler.factory import build_scheduler, runtime_limits

        t0 = time.perf_counter()
        model_dir = resolve_model_dir(args.model_path, args.model_cache_dir)
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_path or model_dir)
        scheduler = build_scheduler(args, model_dir, tokenizer)
        loop = SchedulerProcessLoop(scheduler, ipc, args.stream_interval)
        runner = scheduler.runner
        ready.send({
            "status": "ready", "model_dir": model_dir, "limits": dataclasses.asdict(runtime_limits(scheduler)),
            "resolved_args": dataclasses.asdict(runner.args), "dtype": str(runner.dtype).replace("torch.", ""),
            "device": str(runner.device), "load_seconds": time.perf_counter() - t0,
        })
    except Exception as e:
        logger.exception("scheduler failed to start")
        ready.send({"status": "error", "message": f"{type(e).__name__}: {e}"})
        return
    loop.run()
