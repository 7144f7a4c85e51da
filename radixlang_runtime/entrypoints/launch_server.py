"""`python -m radixlang_runtime.launch_server [--model-path ...] [--port 30000] ...`

Starts the scheduler process (model + KV cache) and the detokenizer process, waits until both report
ready, then serves HTTP (FastAPI on uvicorn with uvloop) in this process, where the
TokenizerManager lives. If a child dies, /health turns 503, requests in flight get an error, and the
server exits with status 1 instead of hanging.

Shutdown: SIGTERM / SIGINT drain (TokenizerManager.drain): new work and /health get 503 at once, the
requests in flight run on for up to --graceful-shutdown-timeout seconds, the rest end with a JSON 503
(an SSE error event then [DONE] for a stream); then the listener closes, the children stop and the
process exits 0. A second signal cuts the drain short. Before the server is up, a signal just stops
the children. Every child dies with this process even when it is SIGKILLed (child_process.py): children
are started from the main thread only, which lives as long as the process.

Parallelism: --dp-size M starts M replicas, each a scheduler process (TP rank 0) plus its TP worker
processes (ranks 1..tp_size-1 on this node, model/executor/tp_worker.py); every one of them is a child the
watchdog watches. With --nnodes N, node 0 runs this; nodes 1..N-1 run the same command with their
--node-rank and only start their TP ranks (no HTTP), exiting when any of them exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

from radixlang_runtime.server_args import ServerArgs
from radixlang_runtime.server_cli import parse_server_args

if TYPE_CHECKING:
    from radixlang_runtime.server.http_common import ServerState

logger = logging.getLogger("radixlang_runtime.entrypoints.launch_server")
READY_TIMEOUT_S = 1800  # first start converts the GGUF model and may compile kernels
WRITE_OUT_S = 5  # after the drain: time for the last responses to reach their clients before uvicorn cuts them


def _wait_ready(proc: mp.Process, conn: Any, name: str, others: list[mp.Process] = ()) -> dict:
    """proc's ready message; an error as soon as proc or one of `others` (its TP ranks) exits."""
    deadline = time.time() + READY_TIMEOUT_S
    while time.time() < deadline:
        if conn.poll(0.2):
            msg = conn.recv()
            if msg.get("status") != "ready":
                raise RuntimeError(f"{name} failed to start: {msg.get('message')}")
            return msg
        for p in [proc, *others]:
            if not p.is_alive():
                raise RuntimeError(f"{p.name} exited with code {p.exitcode} before {name} was ready")
    raise RuntimeError(f"{name} not ready after {READY_TIMEOUT_S} s")


def _replica_args(args: ServerArgs, replica: int) -> ServerArgs:
    """Replica `replica`'s arguments: its own TP rendezvous (dist_init_addr's port + replica, or a
    free local port)."""
    if args.tp_size == 1:
        return args
    from radixlang_runtime.model.executor.tp_worker import free_local_addr

    if args.dist_init_addr is None:
        return args.replace(dist_init_addr=free_local_addr())
    host, _, port = args.dist_init_addr.rpartition(":")
    return args.replace(dist_init_addr=f"{host}:{int(port) + replica}")


def _preload_http() -> None:
    """Imports what serving needs (the HTTP app, uvicorn, transformers' tokenizer) while the children load;
    a failure here is left to the real import, which raises it where it is handled."""
    with contextlib.suppress(Exception):
        import uvicorn  # noqa: F401

        import radixlang_runtime.server.http_server  # noqa: F401
        from radixlang_runtime.model.loader.tokenizer import preload

        preload()


def run_node(args: ServerArgs) -> int:
    """Nodes > 0 of a multi-node group: run this node's TP ranks until one exits (or SIGTERM)."""
    from radixlang_runtime.model.executor.tp_worker import local_ranks, spawn_tp_workers

    signal.signal(signal.SIGTERM, _raise_exit)
    procs = spawn_tp_workers(args, local_ranks(args))
    logger.info("node %d: tp ranks %s, group at %s", args.node_rank, local_ranks(args), args.dist_init_addr)
    code = 0
    try:
        while all(p.is_alive() for p in procs):
            time.sleep(0.5)
        ended = [p for p in procs if not p.is_alive()]
        code = max(p.exitcode or 0 for p in ended)
        logger.info("%s exited with code %s: node %d stops", ended[0].name, ended[0].exitcode, args.node_rank)
    except (SystemExit, KeyboardInterrupt):
        code = 0
    finally:
        _stop(procs)
    return code


def _stop(procs: list[mp.Process]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _uvicorn_server(config: Any) -> Any:
    """A uvicorn.Server that leaves SIGTERM / SIGINT to us: uvicorn's own handlers would stop at once
    (closing the listener, then cutting the requests after its timeout) and re-raise the signal at the
    end (exit status 143); ours drain first (launch_server's lifespan)."""
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return _Server(config)


class Supervisor:
    """Node 0's server: starts the children (per replica a scheduler + its TP ranks, then the
    detokenizer), serves HTTP and the ZeroMQ frontend, watches every child, drains on a signal, and
    stops the children on the way out. run() returns the process's exit code."""

    def __init__(self, args: ServerArgs):
        self.args = args
        self.procs: list[mp.Process] = []  # every child, watched by the watchdog
        self.child_pids: dict[str, int] = {}
        self.exit_code = 0
        self.state: Optional["ServerState"] = None
        self.server: Any = None  # the uvicorn server while it runs
        self.drain_task: Optional[asyncio.Task] = None
        self._ctx = mp.get_context("spawn")

    def run(self) -> int:
        from radixlang_runtime.server.ipc import IpcPaths

        # Until the server's lifespan installs the drain's handlers, SIGTERM must still run the cleanup below.
        signal.signal(signal.SIGTERM, _raise_exit)
        ipc = IpcPaths.create()
        try:
            starting = self._start_replicas(ipc)
            detok = self._start_detokenizer(ipc)
            threading.Thread(target=_preload_http, name="preload", daemon=True).start()
            info = [_wait_ready(*s) for s in starting][0]
            model_dir, tokenizer_class = info.pop("model_dir"), info.pop("tokenizer_class")
            detok[1].send((model_dir, tokenizer_class))
            # its tokenizer loads beside the detokenizer's
            self.state = self._server_state(ipc, model_dir, tokenizer_class, info)
            _wait_ready(detok[0], detok[2], "detokenizer")
            self.exit_code = self._serve_http()
        except SystemExit as e:
            self.exit_code = e.code if isinstance(e.code, int) else 1
        except KeyboardInterrupt:  # Ctrl+C before the drain's handlers are in place (the model still loading)
            logger.info("interrupted while starting: stopping")
            self.exit_code = 130
        except RuntimeError as e:
            logger.error("%s", e)
            self.exit_code = 1
        finally:
            _stop(self.procs)
            ipc.cleanup()
        return self.exit_code

    # ------------------------------------------------------------------ children
    def _start_replicas(self, ipc: Any) -> list[tuple]:
        """Every replica starts loading at once; returns the _wait_ready arguments of each (replica 0 first)."""
        from radixlang_runtime.model.executor.tp_worker import local_ranks, spawn_tp_workers
        from radixlang_runtime.server.scheduler_process import run_scheduler_process

        starting = []
        for i in range(self.args.dp_size):
            rargs = _replica_args(self.args, i)
            workers = spawn_tp_workers(rargs, [r for r in local_ranks(rargs) if r != 0])
            self.procs += workers
            self.child_pids.update({f"tp{i}.{r}": p.pid for r, p in zip(local_ranks(rargs)[1:], workers)})
            r, w = self._ctx.Pipe(duplex=False)
            name = "scheduler" if i == 0 else f"scheduler{i}"
            sched = self._ctx.Process(target=run_scheduler_process, args=(rargs, ipc.for_replica(i), w, i),
                                      name=f"radixlang-{name}", daemon=True)
            sched.start()
            self.procs.append(sched)
            self.child_pids[name] = sched.pid
            starting.append((sched, r, name, workers))
        return starting

    def _start_detokenizer(self, ipc: Any) -> tuple:
        """Starts the detokenizer beside the schedulers (its imports overlap the model's load); returns the
        process, the connection it waits on for the model directory, and its ready connection."""
        from radixlang_runtime.server.detokenizer import run_detokenizer_process

        r, w = self._ctx.Pipe(duplex=False)
        dir_r, dir_w = self._ctx.Pipe(duplex=False)
        detok = self._ctx.Process(target=run_detokenizer_process, args=(self.args, ipc, dir_r, w),
                                  name="radixlang-detokenizer", daemon=True)
        detok.start()
        self.procs.append(detok)
        self.child_pids["detokenizer"] = detok.pid
        return detok, dir_w, r

    def _server_state(self, ipc: Any, model_dir: str, tokenizer_class: Optional[str], info: dict) -> "ServerState":
        from radixlang_runtime.fim_templates import completion_fim
        from radixlang_runtime.multimodal.image_prep import image_prep
        from radixlang_runtime.protocol.limits import RuntimeLimits
        from radixlang_runtime.model.loader.resolve import served_name
        from radixlang_runtime.model.loader.tokenizer import load_tokenizer
        from radixlang_runtime.pooling import PoolingConfig
        from radixlang_runtime.server.http_server import ServerState
        from radixlang_runtime.server.metrics import ServerMetrics
        from radixlang_runtime.server.tokenizer_manager import TokenizerManager

        args = self.args
        name = args.served_model_name or served_name(args.model_path)
        tokenizer = load_tokenizer(args.tokenizer_path or model_dir, tokenizer_class)
        metrics = ServerMetrics(name) if args.enable_metrics else None
        limits = RuntimeLimits(**info.pop("limits"))
        tm = TokenizerManager(ipc, tokenizer, limits, metrics,
                              num_replicas=args.dp_size, load_balance_method=args.load_balance_method,
                              health_stall_timeout=args.health_stall_timeout,
                              images=image_prep(model_dir, limits, args, tokenizer))
        resolved = ServerArgs(**info.pop("resolved_args"))
        pooling = info.pop("pooling")
        try:  # /v1/completions suffix: the named template's markers, or the one the tokenizer's tokens tell (logged)
            fim = completion_fim(args.completion_template, tokenizer) if pooling is None else None
        except ValueError as e:
            raise RuntimeError(str(e)) from None
        return ServerState(resolved, tm, model_dir, name, info, self.child_pids,
                           pooling=PoolingConfig.from_dict(pooling) if pooling is not None else None, fim=fim)

    # ------------------------------------------------------------------ serving
    def _serve_http(self) -> int:
        """Serve HTTP (and the ZeroMQ frontend) until a signal's drain ends or a child dies; the exit code."""
        import uvicorn

        from radixlang_runtime.server.http_server import create_app

        args = self.args
        app = create_app(self.state, lifespan=self._lifespan)
        config = uvicorn.Config(app, host=args.host, port=args.port, loop="uvloop", log_level=args.log_level,
                                timeout_graceful_shutdown=WRITE_OUT_S, access_log=False)
        self.server = _uvicorn_server(config)
        self.server.run()
        if self.server.started is False and self.exit_code == 0:
            return 1  # e.g. the port was taken
        return self.exit_code

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            dead = [p for p in self.procs if not p.is_alive()]
            if dead:
                why = f"{dead[0].name} exited with code {dead[0].exitcode}"
                logger.error("%s: shutting down", why)
                self.state.tm.mark_dead(why)
                self.exit_code = 1
                await asyncio.sleep(0.5)  # let handlers answer 5xx before the server stops
                self.server.should_exit = True
                return

    async def _drain(self) -> None:
        timeout = self.args.graceful_shutdown_timeout
        started, cut = await self.state.tm.drain(timeout)
        why = "a second signal ended the drain" if self.state.tm.lifecycle.cut_now else f"the {timeout:g} s limit"
        logger.info("drained: %d of %d request(s) in flight finished, %d cut (%s); stopping",
                    started - cut, started, cut, why)
        self.server.should_exit = True

    def _on_signal(self, signum: int) -> None:
        tm = self.state.tm
        if self.drain_task is None:
            logger.info("%s: draining (new requests get 503; up to %g s for the %d in flight)",
                        signal.Signals(signum).name, self.args.graceful_shutdown_timeout, tm.in_flight())
            self.drain_task = asyncio.get_running_loop().create_task(self._drain())
        else:  # a second signal: end the drain now
            tm.lifecycle.cut_now = True

    def _start_frontend(self) -> Any:
        """The DSL's ZeroMQ link (on by default; --frontend-port -1: off), same services as HTTP."""
        args, state = self.args, self.state
        if args.frontend_port == -1:
            return None
        from radixlang_runtime.server.frontend_zmq import FrontendServer, frontend_address

        frontend = FrontendServer(frontend_address(args.host, args.frontend_port), state, state.tm, args.api_key)
        frontend.start()
        state.frontend = frontend  # /health and /server_info report it
        return frontend

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Any):
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        state, info = self.state, self.state.info
        state.tm.start()
        frontend = self._start_frontend()
        task = loop.create_task(self._watchdog())
        logger.info("ready: http://%s:%d (model %s, %s on %s, loaded in %.1f s)", self.args.host, self.args.port,
                    state.served_model_name, info["dtype"], info["device"], info["load_seconds"])
        yield
        task.cancel()
        if frontend is not None:
            state.frontend = None
            await frontend.close()
        for sig in (signal.SIGTERM, signal.SIGINT):  # from here on a signal stops at once (_raise_exit)
            loop.remove_signal_handler(sig)
        signal.signal(signal.SIGTERM, _raise_exit)


def launch_server(args: ServerArgs) -> int:
    if args.node_rank > 0:
        return run_node(args)
    return Supervisor(args).run()


def main(argv: list[str] | None = None) -> int:
    args = parse_server_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s server %(levelname)s %(message)s")
    try:
        return launch_server(args)
    except KeyboardInterrupt:  # between the flags and the supervisor
        return 130


if __name__ == "__main__":
    sys.exit(main())
