"""The scheduler process: owns the model and the KV cache; the shared RequestLoop over ZeroMQ.

ZmqIO is the loop's I/O here: requests and control messages arrive on a PULL socket, token progress
goes to the detokenizer, errors and control replies go straight to the tokenizer manager, and so does a
SchedulerHeartbeat at least every HEARTBEAT_S while the loop turns (/health's stall report). A step
fault ends only its batch's requests (each gets an ErrorOut); the process dies with its parent
(child_process.py), even when the parent is SIGKILLed.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import zmq

from radixlang_runtime.utils.child_process import bind_to_parent
from radixlang_runtime.utils.faults import FatalFault
from radixlang_runtime.protocol.messages import BatchTokenIDOut, ErrorOut, SchedulerHeartbeat, decode, encode, rids_of
from radixlang_runtime.scheduler.loop import RequestLoop
from radixlang_runtime.server.ipc import IpcPaths
from radixlang_runtime.server.lifecycle import HEARTBEAT_S
from radixlang_runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)


class ZmqIO:
    def __init__(self, ipc: IpcPaths, replica: int = 0):
        self.replica = replica
        self._heartbeat_at = 0.0
        ctx = zmq.Context()
        self.recv = ctx.socket(zmq.PULL)
        self.recv.bind(ipc.scheduler_in)
        self.to_detok = ctx.socket(zmq.PUSH)
        self.to_detok.connect(ipc.detokenizer_in)
        self.to_tokenizer = ctx.socket(zmq.PUSH)
        self.to_tokenizer.connect(ipc.tokenizer_in)

    def receive(self, timeout: float) -> list[Any]:
        # The loop calls this once per iteration (before every step, and every idle_wait when idle), so
        # a heartbeat goes out unless one step runs long; a step that never returns stops them.
        now = time.monotonic()
        if now - self._heartbeat_at >= HEARTBEAT_S:
            self._heartbeat_at = now
            try:  # droppable: never block on it (the tokenizer manager binds only once every child is ready)
                self.to_tokenizer.send(encode(SchedulerHeartbeat(self.replica)), flags=zmq.NOBLOCK)
            except zmq.Again:
                pass
        if timeout > 0 and not self.recv.poll(timeout=int(timeout * 1000)):
            return []
        msgs = []
        while True:
            try:
                data = self.recv.recv(flags=zmq.NOBLOCK)
            except zmq.Again:
                return msgs
            try:
                msgs.append(decode(data))
            except Exception as e:  # noqa: BLE001 - a malformed message is dropped, never fatal
                logger.exception("scheduler: undecodable message dropped")
                if rids := rids_of(data):  # its requests fail (400) rather than wait for nothing
                    self.send_error(rids, f"malformed request message: {e}", 400)

    def send_tokens(self, out: BatchTokenIDOut) -> None:
        self.to_detok.send(encode(out))

    def send_error(self, rids: list[str], message: str, status: int = 500) -> None:
        self.to_tokenizer.send(encode(ErrorOut(rids, message, status)))

    def send_control(self, msg: Any) -> None:
        self.to_tokenizer.send(encode(msg))


def run_scheduler_process(args: ServerArgs, ipc: IpcPaths, ready: Connection, replica: int = 0) -> None:
    """Entry point of the child process (replica `replica`'s scheduler, TP rank 0). Reports
    {"status": "ready", ...} or {"status": "error", ...}."""
    bind_to_parent()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s scheduler %(levelname)s %(message)s")
    try:
        from radixlang_runtime.model.loader.resolve import cache_root, resolve_model_dir
        from radixlang_runtime.model.loader.tokenizer import class_ref, load_remembered
        from radixlang_runtime.wiring import (build_scheduler, make_disagg_role, runtime_limits,
                                                          scheduler_stats)

        from radixlang_runtime.model.executor.tp_worker import set_cpu_threads

        set_cpu_threads(args)  # this process is one of several model processes on the node
        t0 = time.perf_counter()
        model_dir = resolve_model_dir(args.model_path, args.model_cache_dir)
        tokenizer = load_remembered(args.tokenizer_path or model_dir, cache_root())
        scheduler = build_scheduler(args, model_dir, tokenizer)
        pd_link = make_disagg_role(args, scheduler)  # PD: the bootstrap socket / the prefills' links
        loop = RequestLoop(scheduler, ZmqIO(ipc, replica), args.stream_interval, stats=scheduler_stats)
        runner = scheduler.runner
        ready.send({
            "status": "ready", "model_dir": model_dir, "tokenizer_class": class_ref(tokenizer),
            "limits": dataclasses.asdict(runtime_limits(scheduler, tokenizer)),
            "resolved_args": dataclasses.asdict(runner.args), "dtype": str(runner.dtype).replace("torch.", ""),
            "device": str(runner.device), "load_seconds": time.perf_counter() - t0,
            "pooling": runner.pooling.to_dict() if runner.pooling is not None else None,
        })
    except Exception as e:
        logger.exception("scheduler failed to start")
        ready.send({"status": "error", "message": f"{type(e).__name__}: {e}"})
        return
    stop = threading.Event()
    if args.enable_hierarchical_cache:  # SIGTERM ends the iteration, then the pool's pages go to the tiers
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        loop.run(stop.is_set)  # until the server stops this process (or its death ends it)
        scheduler.kv.close_tiers(timeout_s=8.0)  # within launch_server._stop's 10 s
        if pd_link is not None:
            pd_link.close()
    except FatalFault as e:  # the requests in flight got their errors; the server sees this exit
        logger.error("scheduler exits: %s", e)
        raise SystemExit(1)
