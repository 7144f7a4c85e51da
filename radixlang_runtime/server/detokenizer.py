"""The detokenizer process: BatchTokenIDOut from the scheduler -> BatchStrOut to the tokenizer manager
(radixlang_runtime/detokenize.py does the decoding). It starts beside the scheduler: its imports run
while the model loads, then it waits (bounded) for the model directory the scheduler resolved. A batch
whose decoding raises is answered with an ErrorOut for its requests (their states dropped); the process
keeps serving. It dies with its parent (child_process.py), even when the parent is SIGKILLed.
"""

from __future__ import annotations

import logging
from multiprocessing.connection import Connection
from typing import Optional

import zmq

from radixlang_runtime.utils.child_process import bind_to_parent
from radixlang_runtime.detokenize import IncrementalDetokenizer
from radixlang_runtime.protocol.messages import BatchTokenIDOut, ErrorOut, decode, encode
from radixlang_runtime.server.ipc import IpcPaths
from radixlang_runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)
MODEL_DIR_TIMEOUT_S = 1800  # launch_server's READY_TIMEOUT_S: a first start converts the GGUF model


def _model_dir(model_dir: Connection) -> tuple[str, Optional[str]]:
    """The model directory and its tokenizer's class (model.loader.tokenizer.class_ref) that the server sends
    once its scheduler is ready (the scheduler may convert a GGUF)."""
    if not model_dir.poll(MODEL_DIR_TIMEOUT_S):
        raise TimeoutError(f"no model directory from the server after {MODEL_DIR_TIMEOUT_S} s")
    return model_dir.recv()


def run_detokenizer_process(args: ServerArgs, ipc: IpcPaths, model_dir: Connection, ready: Connection) -> None:
    """model_dir: the server sends (model directory, tokenizer class) on it once the scheduler has resolved
    them."""
    bind_to_parent()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s detokenizer %(levelname)s %(message)s")
    try:
        from radixlang_runtime.model.loader.tokenizer import load_tokenizer, preload

        preload()  # while the scheduler loads the model
        model_dir, tokenizer_class = _model_dir(model_dir)
        detok = IncrementalDetokenizer(load_tokenizer(args.tokenizer_path or model_dir, tokenizer_class))
        ctx = zmq.Context()
        recv = ctx.socket(zmq.PULL)
        recv.bind(ipc.detokenizer_in)
        send = ctx.socket(zmq.PUSH)
        send.connect(ipc.tokenizer_in)
        ready.send({"status": "ready"})
    except Exception as e:
        logger.exception("detokenizer failed to start")
        ready.send({"status": "error", "message": f"{type(e).__name__}: {e}"})
        return
    while True:
        try:
            msg = decode(recv.recv())
        except Exception:  # noqa: BLE001 - a malformed message is dropped, never fatal
            logger.exception("detokenizer: undecodable message dropped")
            continue
        if isinstance(msg, BatchTokenIDOut):
            out, failed = detok.update(msg)
            if out.reqs:
                send.send(encode(out))
            for rid, message in failed.items():
                logger.error("detokenizer: request %s failed: %s", rid, message)
                send.send(encode(ErrorOut([rid], message)))
