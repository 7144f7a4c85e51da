"""`python -m radixlang_runtime.launch_server [--model-path ...] [--port 30000] ...`

Starts the scheduler process (model + KV cache) and the detokenizer process, waits until both report
ready, then serves HTTP (FastAPI on uvicorn with uvloop) in this process, where the
TokenizerManager lives. SIGTERM / SIGINT stop the server and every child. If a child dies, /health
turns 503, requests in flight get an error, and the server exits with status 1 instead of hanging.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import multiprocessing as mp
import signal
import sys
import time
from typing import Any

from radixlang_runtime.server_args import ServerArgs

logger = logging.getLogger("radixlang_runtime.launch_server")
READY_TIMEOUT_S = 1800  # first start converts the GGUF model and may compile kernels


def _wait_ready(proc: mp.Process, conn: Any, name: str) -> dict:
    deadline = time.time() + READY_TIMEOUT_S
    while time.time() < deadline:
        if conn.poll(0.2):
            msg = conn.recv()
            if msg.get("status") != "ready":
                raise RuntimeError(f"{name} failed to start: {msg.get('message')}")
            return msg
        if not proc.is_alive():
            raise RuntimeError(f"{name} exited with code {proc.exitcode} before it was ready")
    raise RuntimeError(f"{name} not ready after {READY_TIMEOUT_S} s")


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


def launch_server(args: ServerArgs) -> int:
    import uvicorn
    from transformers import AutoTokenizer

    from radixlang_runtime.limits import RuntimeLimits
    from radixlang_runtime.model.resolve import served_name
    from radixlang_runtime.server.detokenizer import run_detokenizer_process
    from radixlang_runtime.server.http_server import ServerState, create_app
    from radixlang_runtime.server.ipc import IpcPaths
    from radixlang_runtime.server.metrics import ServerMetrics
    from radixlang_runtime.server.scheduler_process import run_scheduler_process
    from radixlang_runtime.server.tokenizer_manager import TokenizerManager

    # Until uvicorn installs its own handlers, SIGTERM must still run the cleanup below.
    signal.signal(signal.SIGTERM, _raise_exit)
    ipc = IpcPaths.create()
    ctx = mp.get_context("spawn")
    procs: list[mp.Process] = []
    exit_code = 0
    try:
        r, w = ctx.Pipe(duplex=False)
        sched = ctx.Process(target=run_scheduler_process, args=(args, ipc, w), name="radixlang-scheduler", daemon=True)
        sched.start()
        procs.append(sched)
        info = _wait_ready(sched, r, "scheduler")
        model_dir = info.pop("model_dir")
        r, w = ctx.Pipe(duplex=False)
        detok = ctx.Process(target=run_detokenizer_process, args=(args, ipc, model_dir, w),
                            name="radixlang-detokenizer", daemon=True)
        detok.start()
        procs.append(detok)
        _wait_ready(detok, r, "detokenizer")

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_path or model_dir)
        metrics = ServerMetrics() if args.enable_metrics else None
        tm = TokenizerManager(ipc, tokenizer, RuntimeLimits(**info.pop("limits")), metrics)
        resolved = ServerArgs(**info.pop("resolved_args"))
        state = ServerState(resolved, tm, model_dir, args.served_model_name or served_name(args.model_path), info,
                            {"scheduler": sched.pid, "detokenizer": detok.pid})
        server: Any = None

        async def watchdog() -> None:
            nonlocal exit_code
            while True:
                await asyncio.sleep(0.5)
                dead = [p for p in procs if not p.is_alive()]
                if dead:
                    why = f"{dead[0].name} exited with code {dead[0].exitcode}"
                    logger.error("%s: shutting down", why)
                    tm.mark_dead(why)
                    exit_code = 1
                    await asyncio.sleep(0.5)  # let handlers answer 5xx before the server stops
                    server.should_exit = True
                    return

        @contextlib.asynccontextmanager
        async def lifespan(app: Any):
            tm.start()
            frontend = None
            if args.frontend_port:  # the DSL's ZeroMQ link, same TokenizerManager as HTTP
                from radixlang_runtime.server.frontend_zmq import FrontendServer

                frontend = FrontendServer(f"tcp://{args.host}:{args.frontend_port}", app, tm, args.api_key)
                frontend.start()
            task = asyncio.get_running_loop().create_task(watchdog())
            logger.info("ready: http://%s:%d (model %s, %s on %s, loaded in %.1f s)", args.host, args.port,
                        state.served_model_name, info["dtype"], info["device"], info["load_seconds"])
            yield
            task.cancel()
            if frontend is not None:
                await frontend.close()

        app = create_app(state, lifespan=lifespan)
        config = uvicorn.Config(app, host=args.host, port=args.port, loop="uvloop", log_level=args.log_level,
                                timeout_graceful_shutdown=5, access_log=False)
        server = uvicorn.Server(config)
        server.run()
        if server.started is False and exit_code == 0:
            exit_code = 1  # e.g. the port was taken
    except SystemExit as e:
        exit_code = e.code if isinstance(e.code, int) else 1
    except RuntimeError as e:
        logger.error("%s", e)
        exit_code = 1
    finally:
        _stop(procs)
        ipc.cleanup()
    return exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixlang_runtime.launch_server",
                                     description="Serve a model over HTTP (SGLang-native and OpenAI-compatible).")
    ServerArgs.add_cli_args(parser)
    args = ServerArgs.from_cli_args(parser.parse_args(argv))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s server %(levelname)s %(message)s")
    return launch_server(args)


if __name__ == "__main__":
    sys.exit(main())
